"""Kernels priced by what runs at each grid step: inner loops by the iterations they run at
that step (bounded by ``program_id`` or a scalar-prefetch value), ``pl.when`` branches by
the side that runs, an epilogue once per output tile; loops bounded by data the kernel
loads are priced at an upper bound or refused. Each kernel is compiled for v6e once (small
shapes) and read from its Mosaic module and bundle dump, as the judge does."""

from jaxbench_env.aot import prepare_process

prepare_process()

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

from jaxbench_env.judge import compile_v6e  # noqa: E402
from jaxbench_env.sim import V6E, calibration, model, mosaic  # noqa: E402

B = 128  # block rows and columns
NQ = 8  # query blocks (grid steps of the causal kernels)
F32 = jnp.float32
BLOCKS = jax.ShapeDtypeStruct((NQ * B, B), jnp.bfloat16)


def _scores(q, k):
    return jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def _key_loop(trips_of):
    """A causal-style kernel: query block i sums tanh(q kᵀ) over ``trips_of(i, refs)`` key blocks."""
    def kernel(*refs):
        *tables, q_ref, k_ref, o_ref = refs
        i = pl.program_id(0)

        def body(j, acc):  # one key block: scores, a few element-wise passes, back through the MXU
            k = k_ref[pl.ds(pl.multiple_of(j * B, B), B), :]
            s = _scores(q_ref[...], k)
            for _ in range(4):
                s = jnp.tanh(s) * 1.5
            return acc + jnp.dot(s.astype(k.dtype), k, preferred_element_type=F32)

        o_ref[...] = jax.lax.fori_loop(0, trips_of(i, tables, q_ref), body, jnp.zeros((B, B), F32))
    return kernel


def _call(kernel, *args, prefetch=0):
    n = 8 * B
    in_specs = [pl.BlockSpec((B, B), lambda i, *_: (i, 0)), pl.BlockSpec((n, B), lambda i, *_: (0, 0))]
    out_spec = pl.BlockSpec((B, B), lambda i, *_: (i, 0))
    out_shape = jax.ShapeDtypeStruct((NQ * B, B), F32)
    if prefetch:
        spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=prefetch, grid=(NQ,), in_specs=in_specs,
                                            out_specs=out_spec)
        return pl.pallas_call(kernel, grid_spec=spec, out_shape=out_shape)(*args)
    return pl.pallas_call(kernel, grid=(NQ,), in_specs=in_specs, out_specs=out_spec, out_shape=out_shape)(*args)


def causal(q, k):  # key blocks 0..i: the loop runs i + 1 times at step i
    return _call(_key_loop(lambda i, t, q_ref: i + 1), q, k)


def full(q, k):  # every key block at every step: a static loop
    return _call(_key_loop(lambda i, t, q_ref: NQ), q, k)


def by_table(n, q, k):  # the trip count read from a scalar-prefetch table
    return _call(_key_loop(lambda i, t, q_ref: t[0][i]), n, q, k, prefetch=1)


def by_data(q, k):  # the trip count read from the query block itself (VMEM): no bound
    return _call(_key_loop(lambda i, t, q_ref: q_ref[0:8, :].astype(F32)[0, 0].astype(jnp.int32)), q, k)


def by_capped_data(q, k):  # the same, capped: an upper bound of 3
    return _call(_key_loop(lambda i, t, q_ref: jnp.minimum(q_ref[0:8, :].astype(F32)[0, 0].astype(jnp.int32), 3)), q, k)


def _tiles(skip: bool, epilogue: bool = False):
    """Grid (query block, key block); the heavy step body runs where kj <= qi if ``skip``;
    with ``epilogue``, a heavy finish runs on the last key block only."""
    def kernel(q_ref, k_ref, o_ref, acc_ref):
        qi, kj = pl.program_id(0), pl.program_id(1)

        @pl.when(kj == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        def step():
            s = _scores(q_ref[...], k_ref[...])
            for _ in range(32):
                s = jnp.tanh(s) * 1.5
            acc_ref[...] += s

        if skip:
            pl.when(kj <= qi)(step)
        else:
            step()

        if epilogue:
            @pl.when(kj == pl.num_programs(1) - 1)
            def _finish():
                a = acc_ref[...]
                for _ in range(24):
                    a = jnp.exp(jnp.tanh(a)) * 0.5
                o_ref[...] = a
        else:
            o_ref[...] = acc_ref[...]

    def f(q, k):
        return pl.pallas_call(
            kernel, grid=(NQ, NQ),
            in_specs=[pl.BlockSpec((B, B), lambda i, j: (i, 0)), pl.BlockSpec((B, B), lambda i, j: (j, 0))],
            out_specs=pl.BlockSpec((B, B), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((NQ * B, B), F32),
            scratch_shapes=[pltpu.VMEM((B, B), F32)],
        )(q, k)
    return f


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def gridless(x):  # no grid, operands and output in VMEM
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                          out_specs=pl.BlockSpec(memory_space=pltpu.VMEM))(x)


def hand_copied(k_hbm, parts=1):
    """Step i copies i + 1 blocks by hand, in a loop bounded by program_id; each block in
    ``parts`` copies started together, then waited on."""
    rows = B // parts

    def kernel(k_hbm, o_ref, buf, sem):
        def body(j, c):
            copies = [pltpu.make_async_copy(k_hbm.at[pl.ds(pl.multiple_of(j * B + p * rows, rows), rows)],
                                            buf.at[pl.ds(p * rows, rows)], sem) for p in range(parts)]
            for cp in copies:
                cp.start()
            for cp in copies:
                cp.wait()
            o_ref[...] += buf[...].astype(F32)
            return c

        o_ref[...] = jnp.zeros_like(o_ref)
        jax.lax.fori_loop(0, pl.program_id(0) + 1, body, 0)

    return pl.pallas_call(kernel, grid=(NQ,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec((B, B), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((NQ * B, B), F32),
                          scratch_shapes=[pltpu.VMEM((B, B), jnp.bfloat16), pltpu.SemaphoreType.DMA])(k_hbm)


def copied_blocks(prefetch: bool):
    """Step i copies key block i by hand and runs 32 element-wise passes over it: waiting for
    the copy right after starting it, or, with ``prefetch``, starting step i + 1's copy into
    the other buffer before waiting for its own (jax's paged kernels' pattern)."""
    def kernel(k_hbm, o_ref, buf, sems):
        i, n = pl.program_id(0), pl.num_programs(0)

        def copy(block, slot):
            return pltpu.make_async_copy(k_hbm.at[pl.ds(pl.multiple_of(block * B, B), B)], buf.at[slot], sems.at[slot])

        if prefetch:
            slot = i % 2

            @pl.when(i == 0)
            def _():
                copy(0, 0).start()

            @pl.when(i + 1 < n)
            def _():
                copy(i + 1, 1 - slot).start()
        else:
            slot = 0
            copy(i, slot).start()
        copy(i, slot).wait()
        s = buf[slot].astype(F32)
        for _ in range(32):
            s = jnp.tanh(s) * 1.5
        o_ref[...] = s

    def f(k):
        return pl.pallas_call(kernel, grid=(NQ,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((B, B), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((NQ * B, B), F32),
                              scratch_shapes=[pltpu.VMEM((2, B, B), jnp.bfloat16), pltpu.SemaphoreType.DMA((2,))],
                              compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))(k)
    return f


def _heavy(flag: bool):
    """Each step: 32 element-wise passes over a block; with ``flag``, step 0 also sets an
    SMEM flag under pl.when (a side so small the compiler predicates it: no branch)."""
    def kernel(q_ref, o_ref, flag_ref):
        s = q_ref[...].astype(F32)
        for _ in range(32):
            s = jnp.tanh(s) * 1.5
        o_ref[...] = s
        if flag:
            @pl.when(pl.program_id(0) == 0)
            def _():
                flag_ref[0] = 1

    def f(q):
        return pl.pallas_call(kernel, grid=(NQ,), in_specs=[pl.BlockSpec((B, B), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((B, B), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((NQ * B, B), F32),
                              scratch_shapes=[pltpu.SMEM((1,), jnp.int32)])(q)
    return f


TABLE = np.array([3, 0, 8, 1, 5, 2, 7, 4], np.int32)
N = jax.ShapeDtypeStruct((NQ,), jnp.int32)
PROGRAMS = {
    "causal": (causal, [BLOCKS, BLOCKS], None),
    "full": (full, [BLOCKS, BLOCKS], None),
    "by_table": (by_table, [N, BLOCKS, BLOCKS], [[TABLE]]),
    "by_data": (by_data, [BLOCKS, BLOCKS], None),
    "by_capped_data": (by_capped_data, [BLOCKS, BLOCKS], None),
    "skip": (_tiles(skip=True), [BLOCKS, BLOCKS], None),
    "no_skip": (_tiles(skip=False), [BLOCKS, BLOCKS], None),
    "epilogue": (_tiles(skip=False, epilogue=True), [BLOCKS, BLOCKS], None),
    "gridless": (gridless, [jax.ShapeDtypeStruct((256, 128), F32)], None),
    "hand_copied": (hand_copied, [BLOCKS], None),
    "hand_copied_halves": (functools.partial(hand_copied, parts=2), [BLOCKS], None),
    "copied_waited": (copied_blocks(prefetch=False), [BLOCKS], None),
    "copied_prefetched": (copied_blocks(prefetch=True), [BLOCKS], None),
    "heavy": (_heavy(False), [BLOCKS], None),
    "heavy_flag": (_heavy(True), [BLOCKS], None),
}


@pytest.fixture(scope="module")
def compiled():
    """name -> (compiled, bundle profiles, prefetch), each kernel compiled once."""
    @functools.cache
    def get(name):
        fn, specs, prefetch = PROGRAMS[name]
        program, profiles = compile_v6e(fn, specs)
        return program, profiles, prefetch
    return get


def kernel_of(compiled, name):
    """(the call, its bundle profile, its Mosaic kernel, its grid, step-by-step counts,
    bundles per step) of a program's one kernel."""
    program, profiles, prefetch = compiled(name)
    (call,) = [c for c in mosaic.hlo_custom_calls(program.as_text()) if c.pallas]
    profile = profiles[call.name]
    kernel = mosaic.parse_kernel(call)
    tables = prefetch[0] if prefetch else None
    grid, _ = mosaic.grid_values(kernel, None)
    counts = mosaic.control_counts(kernel, grid, tables)
    per_step = mosaic.step_bundles(kernel, profile, grid, counts).per_step
    return call, profile, kernel, grid, counts, per_step


def predicted(compiled, name):
    program, profiles, prefetch = compiled(name)
    return model.predict_program(program, V6E, profiles, prefetch)


def loop_body_bundles(profile) -> int:
    """Bundles of one iteration of the compiled kernel's inner loop (the loop inside the grid loop)."""
    inner = [lp for lp in profile.loops if lp != profile.outer_loop()]
    assert len(inner) == 1, profile.loops
    return profile.count(inner[0].start, inner[0].end)


def once_counted(profile, steps: int) -> float:
    """Bundles per step as they were counted before: every loop bounded at run time once."""
    _, per_iteration, trip = profile.per_iteration()
    return per_iteration * trip / steps


def test_loop_bounded_by_program_id_is_priced_by_the_trips_it_runs(compiled):
    _, profile, kernel, _, counts, per_step = kernel_of(compiled, "causal")
    body = loop_body_bundles(profile)
    assert body > 50
    # Step i runs the key loop i + 1 times: its bundles grow by one loop body per step.
    np.testing.assert_allclose(np.diff(per_step), body)
    (loop,) = [i for i, it in enumerate(kernel.body.items) if it.kind == "loop" and it.static_trip is None]
    np.testing.assert_array_equal(counts.flat(counts.mult[loop]), np.arange(1, NQ + 1))
    mean_trips = (NQ + 1) / 2
    expected = per_step[0] + body * (mean_trips - 1)  # hand-computed from the bundle counts
    assert per_step.mean() == pytest.approx(expected)
    assert per_step.mean() > 2.5 * once_counted(profile, NQ)  # counted once, the loop was 4.5x cheaper

    # Against the same work with a static loop of NQ trips at every step: the causal kernel
    # does 4.5 / 8 of its loop iterations, and is priced so (within 1.5x, compute and time).
    causal_sim, full_sim = predicted(compiled, "causal"), predicted(compiled, "full")
    _, full_profile, _, _, _, full_per_step = kernel_of(compiled, "full")
    assert loop_body_bundles(full_profile) == pytest.approx(body, rel=0.1)
    ratio = mean_trips / NQ
    compute = causal_sim.kernels[0]["compute_s"] / full_sim.kernels[0]["compute_s"]
    assert ratio / 1.5 < compute < ratio * 1.5
    assert ratio / 1.5 < causal_sim.time_s / full_sim.time_s < ratio * 1.5
    assert causal_sim.kernels[0]["compute_from"] == "bundles"


def test_loop_bounded_by_a_prefetched_table_runs_the_tables_trips(compiled):
    _, profile, _, _, counts, per_step = kernel_of(compiled, "by_table")
    body = loop_body_bundles(profile)
    # Step i runs TABLE[i] iterations (the zero-trip step skips the loop and its guard).
    run = TABLE > 0
    expected = per_step[run][0] + body * (TABLE - TABLE[run][0])
    np.testing.assert_allclose(per_step[run], expected[run])
    assert per_step[~run][0] < per_step[run].min()
    sim = predicted(compiled, "by_table")
    assert not any("upper bound" in n for n in sim.notes)


def test_pl_when_block_skipping_is_charged_only_where_it_runs(compiled):
    skip, no_skip = predicted(compiled, "skip"), predicted(compiled, "no_skip")
    _, profile, kernel, _, counts, per_step = kernel_of(compiled, "skip")
    # Two kinds of steps (and the first key block's initialisation): the skipped ones are
    # cheaper by the branch's bundles; a step that computes costs what it does without the skip.
    qi, kj = np.indices((NQ, NQ)).reshape(2, -1)
    skipped, computed = per_step[kj > qi], per_step[(kj <= qi) & (kj > 0)]
    assert np.ptp(skipped) == 0 and np.ptp(computed) == 0
    branch = computed[0] - skipped[0]
    assert branch > 0.6 * computed[0]
    _, _, _, _, _, plain = kernel_of(compiled, "no_skip")
    assert computed[0] == pytest.approx(np.median(plain), rel=0.1)
    # The compute saved is the skipped steps' share (28 of 64) of the branch's bundles.
    ran = NQ * (NQ + 1) / 2 / NQ**2
    compute = skip.kernels[0]["compute_s"] / no_skip.kernels[0]["compute_s"]
    saved = (1 - ran) * branch / np.median(plain)
    assert compute == pytest.approx(1 - saved, abs=0.05)
    assert ran < compute < ran + 0.25
    # The time saved is the compute saved, down to the per-step latency: a skipped step
    # still costs at least that (its copies are in flight).
    cal = calibration()

    def step(bundles):  # the step's copies are small: the latency stands for them
        return model.step_s(bundles / cal.bundle_rate_hz, 0.0, 0.0, cal.step_overhead_s, cal.overlap)

    saved_s = int(np.sum(kj > qi)) * (step(computed[0]) - step(skipped[0]))
    assert saved_s > 0
    assert no_skip.time_s - skip.time_s == pytest.approx(saved_s, rel=0.3)


def test_last_step_epilogue_is_charged_once_per_output_tile(compiled):
    _, profile, _, _, counts, per_step = kernel_of(compiled, "epilogue")
    _, _, _, _, _, plain = kernel_of(compiled, "no_skip")
    qi, kj = np.indices((NQ, NQ)).reshape(2, -1)
    last, middle = per_step[kj == NQ - 1], per_step[(kj > 0) & (kj < NQ - 1)]
    assert np.ptp(last) == 0 and np.ptp(middle) == 0
    finish = last[0] - middle[0]  # the epilogue's bundles, on the last key block only
    assert finish > 100
    assert len(last) == NQ  # once per output tile
    first = per_step[kj == 0]
    assert np.ptp(first) == 0
    total = per_step.sum()
    assert total == pytest.approx(NQ * NQ * middle[0] + NQ * (first[0] - middle[0]) + NQ * finish)
    everywhere = total + finish * (NQ * NQ - NQ)  # as if charged on every step (before)
    assert total < 0.6 * everywhere
    assert middle[0] == pytest.approx(np.median(plain), rel=0.15)  # the other steps: the plain kernel's


def test_a_predicated_branch_side_cannot_stand_for_the_kernel_body(compiled):
    # The flag's side has no branch of its own in the compiled kernel; the only branch there
    # is the pipeline's, around the whole body. Matched to the flag's side, the body would be
    # charged on step 0 only (6x cheaper here): it must not be.
    plain, flagged = predicted(compiled, "heavy"), predicted(compiled, "heavy_flag")
    k, f = plain.features.kernels[0], flagged.features.kernels[0]
    assert f.bundles_per_step == pytest.approx(k.bundles_per_step, rel=0.02)
    assert flagged.time_s == pytest.approx(plain.time_s, rel=0.02)


def test_loop_bounded_by_loaded_data_is_bounded_or_refused(compiled):
    program, profiles, _ = compiled("by_data")
    with pytest.raises(mosaic.Unpriceable, match=r"kernel .*: loop 1 \(scf.for\) has no upper bound"):
        model.predict_program(program, V6E, profiles, None)

    sim = predicted(compiled, "by_capped_data")
    notes = [n for n in sim.notes if "upper bound" in n]
    assert len(notes) == 1 and "loop 1 (scf.for)" in notes[0] and "upper bound, 3 per grid step" in notes[0]
    _, profile, _, _, _, per_step = kernel_of(compiled, "by_capped_data")
    _, _, _, _, _, causal_steps = kernel_of(compiled, "causal")
    body = loop_body_bundles(profile)
    assert np.ptp(per_step) == 0  # every step at the bound: 3 iterations, as the causal kernel's step 2
    assert per_step[0] == pytest.approx(causal_steps[2], rel=0.1)
    assert per_step[0] > once_counted(profile, NQ) + 1.5 * body


def test_hand_issued_copies_in_a_loop_count_once_per_trip(compiled):
    sim = predicted(compiled, "hand_copied")
    k = sim.features.kernels[0]
    block = B * B * 2  # one bf16 key block per trip
    out = NQ * B * B * 4
    assert k.manual_dma and k.hbm_bytes == pytest.approx(block * NQ * (NQ + 1) / 2 + out)


@pytest.mark.parametrize("name", ["hand_copied", "hand_copied_halves"])
def test_each_group_of_hand_issued_copies_waits_out_the_copy_latency(compiled, name):
    sim = predicted(compiled, name)
    k = sim.features.kernels[0]
    # Step i issues i + 1 groups, however many copies start together in one.
    # (Each is waited for before any compute: its groups wait in line.)
    groups = sorted(g for g, (_, _, n) in zip(k.row_waited_groups, k.traffic) for _ in range(n))
    assert groups == list(range(1, NQ + 1)) and k.row_dma_groups is None
    # Each group costs at least the latency, as a grid step does, even with almost no bytes or compute.
    latency = calibration().step_overhead_s
    assert sim.kernels[0]["time_s"] >= latency * NQ * (NQ + 1) / 2 > 3 * latency * NQ


def test_a_copy_waited_for_as_it_starts_is_not_hidden_behind_compute(compiled):
    waited, prefetched = predicted(compiled, "copied_waited"), predicted(compiled, "copied_prefetched")
    (kw,), (kp,) = waited.features.kernels, prefetched.features.kernels
    block = B * B * 2
    # The same bytes: one key block a step in, one output block out.
    assert kw.hbm_bytes == kp.hbm_bytes == NQ * (block + B * B * 4)
    # Waited for at once, each step's copy is serial traffic and waits out its latency in line...
    assert [t[1] for t in kw.traffic] == [block] * len(kw.traffic) and kw.row_dma_groups is None
    assert sum(g * t[2] for g, t in zip(kw.row_waited_groups, kw.traffic)) == NQ
    # ...where the next step's copy, started before this one's wait, runs behind this step's compute.
    assert all(t[1] == 0 for t in kp.traffic) and kp.row_waited_groups is None
    latency = calibration().step_overhead_s
    assert waited.time_s - prefetched.time_s > 0.5 * NQ * latency


def test_gridless_vmem_kernel_is_priced(compiled):
    sim = predicted(compiled, "gridless")
    (k,) = sim.features.kernels
    assert k.grid == () and k.steps == 1
    assert k.hbm_bytes == 2 * 256 * 128 * 4  # read the input, write the output
    assert k.bundles_per_step and k.bundles_per_step > 10 and k.bundles_outside == 0
    assert sim.kernels[0]["compute_from"] == "bundles" and sim.time_s > k.hbm_bytes / V6E.hbm_bytes_per_s


def test_bundle_dump_loops_and_branches_are_read_from_latches_and_targets():
    # As libtpu writes them: a loop ends with the backward branch to the region it starts
    # (plus 4 delay slots); a forward branch skips from after its delay slots to its target;
    # the depth marks are not a loop's extent (depth-1 bundles inside the inner loop).
    from jaxbench_env.sim import bundles

    lines = ["     0   :  { %1 = vsyncpa } /* Start region 9 */",
             "   0x1 LB: > { %2 = sadd.s32 1, %s3 } /* Start region 96 */",
             "   0x2   : > { %3 = sbr.rel (%p4) target = $region28 }"]
    lines += [f"   {hex(a)}   : > {{}}" for a in range(0x3, 0x8)]
    lines += ["   0x8 LB: >> { %5 = vld } /* Start region 85 */",
              "   0x9   : > { %6 = scmp.lt.s32.totalorder %s1, %s2 }",  # an outer bundle inside
              "   0xa   : >> { %7 = sbr.rel (!%p8) target = $region85 }"]
    lines += [f"   {hex(a)}   : >> {{}}" for a in range(0xb, 0xf)]
    lines += ["   0xf PF: > { %9 = vst } /* Start/End empty region 28 */",
              "  0x10   : > { %p10 = scmp.ge.s32.totalorder %s11, 6 /* loop exit test */ }",
              "  0x11   : > { %12 = sbr.rel (!%p10) target = $region96 }"]
    lines += [f"  {hex(a)}   :  {{}}" for a in range(0x12, 0x16)]
    lines += ["  0x16   :  { %13 = vsyncpa }"]
    p = bundles.parse("\n".join(lines))
    assert p.static == 0x17
    assert [(lp.start, lp.end, lp.trip) for lp in p.loops] == [(0x1, 0x15, 6), (0x8, 0xe, None)]
    assert [(b.at, b.skip_start, b.skip_end) for b in p.branches] == [(0x2, 0x7, 0xe)]
    (grid,) = p.control()
    (skip,) = grid.children
    (inner,) = skip.children
    assert (grid.kind, skip.kind, inner.kind) == ("loop", "branch", "loop")
    assert (grid.size, skip.size, inner.size) == (0x15, 8, 7)
