"""Kernels read from their Mosaic modules (what the judge compiles) agree with the same
kernels read from the jaxpr: grid, traffic step by step, VMEM, body work; index maps are
evaluated without running any Python of the kernel's; output coverage is checked."""

from jaxbench_env.aot import prepare_process

prepare_process()

import dataclasses  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import workloads  # noqa: E402
from jaxbench_env.aot import compile_for_v6e, v6e_device  # noqa: E402
from jaxbench_env.candidate_process import load_module  # noqa: E402
from jaxbench_env.sim import V6E, model, mosaic, pallas  # noqa: E402

# case -> (workload, source ("template" or "expert"), schedule)
CASES = {
    "gemm": ("gemm", "template", {}),
    "gemm_single_buffered": ("gemm", "template", {"buffers": 1}),
    "flash_attention": ("flash_attention", "template", {}),
    "megablox_gmm": ("megablox_gmm", "template", {}),  # scalar-prefetch index maps
    "megablox_gmm_dynamic_grid": ("megablox_gmm", "expert", {}),  # and a grid axis sized at run time
    "paged_attention": ("paged_attention", "template", {}),  # tables, HBM operands, hand-issued DMAs
    "ragged_dot": ("ragged_dot", "template", {}),
    "mamba2_ssd": ("mamba2_ssd", "template", {}),
    "conv2d_relu_biasadd": ("conv2d_relu_biasadd", "template", {}),  # whole-array blocks: single-buffered
}


def export_tpu(fn, *specs):
    with jax.default_device(v6e_device()):
        return jax.export.export(jax.jit(fn), platforms=["tpu"])(*specs)


def traced_and_exported(fn, *specs):
    """(pallas_call equations, tpu_custom_calls) of one program, in program order."""
    closed = jax.jit(fn).trace(*specs).jaxpr
    calls = mosaic.stablehlo_custom_calls(export_tpu(fn, *specs).mlir_module())
    return closed, pallas.pallas_call_eqns(closed.jaxpr), calls


@functools.lru_cache(maxsize=None)
def program(case: str):
    """(eqns, calls, concrete prefetch operands per kernel) of a workload's full-size program."""
    name, which, schedule = CASES[case]
    wl = workloads.get(name)
    source = wl.template_source() if which == "template" else wl.expert_source()
    module = load_module(source, wl.config, schedule)
    specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
    closed, eqns, calls = traced_and_exported(module.workload, *specs)
    assert len(eqns) == len(calls) >= 1
    values = pallas.prefetch_operands(closed, lambda: wl.make_inputs(wl.config, 0))
    return eqns, calls, [values.get(id(e), []) for e in eqns]


WORK = ("flops", "vector_ops", "transcendentals")


def assert_same_work(a: dict, b: dict) -> None:
    # Lowering adds or folds a few scalar ops (index arithmetic, predicate casts).
    assert b["flops"] == a["flops"]
    assert b["vector_ops"] == pytest.approx(a["vector_ops"], rel=0.01, abs=16)
    assert b["transcendentals"] == pytest.approx(a["transcendentals"], rel=0.01, abs=16)


def assert_same_features(a, b, call=None):
    """The jaxpr path's features ``a`` and the Mosaic path's ``b`` of one kernel. The body's
    work differs where the body has branches or loops bounded at run time: the jaxpr path
    counts both sides of every branch and such loops once, the Mosaic path what runs at each
    step (on average); there the jaxpr path's count is the Mosaic body's static count
    (``parse_kernel(call)``), and copies the body issues inside branches count where they
    run (at most the jaxpr path's bytes)."""
    a, b = a.to_dict(), b.to_dict()
    kernel = mosaic.parse_kernel(call) if call is not None else None
    dynamic = kernel is not None and any(it.kind == "arm" or it.static_trip is None for it in kernel.body.items)
    if dynamic:
        assert_same_work(a, {"flops": kernel.flops, "vector_ops": kernel.vector_ops,
                             "transcendentals": kernel.transcendentals})
        if b["manual_dma"]:
            assert b["hbm_bytes"] <= a["hbm_bytes"]
            for key in ("traffic", "hbm_bytes", "fill_bytes", "drain_bytes"):
                del a[key], b[key]
    else:
        assert_same_work(a, b)
    for key in WORK + ("notes", "row_dma_groups"):  # copy groups: counted on the Mosaic path only
        del a[key], b[key]
    assert a == b  # traffic, fill and drain, grid, VMEM, DMA bytes, names, flags: exactly


@pytest.mark.parametrize("case", list(CASES))
def test_mosaic_features_equal_jaxpr_features(case):
    eqns, calls, values = program(case)
    for eqn, call, prefetch in zip(eqns, calls, values):
        for p in ([None, prefetch] if prefetch else [None]):
            assert_same_features(pallas.kernel_features(eqn, p), mosaic.kernel_features(call, p), call)


@pytest.mark.parametrize("case", list(CASES))
def test_templates_write_every_output_element(case):
    _, calls, values = program(case)
    for call, prefetch in zip(calls, values):
        coverage = mosaic.output_coverage(call, prefetch)
        assert coverage == [] and coverage.unverified == [], (coverage, coverage.unverified)


def test_kernel_conventions_read_from_the_module():
    (_, calls, values) = program("megablox_gmm_dynamic_grid")
    k = mosaic.parse_kernel(calls[0])
    assert k.num_dynamic_bounds == 1 and None in k.iteration_bounds
    assert k.num_leading == len(values[0]) == len(calls[0].operands) - 2  # the lhs and rhs follow
    assert len(k.dimension_semantics) == len(k.iteration_bounds)
    assert [w.output for w in k.windows] == [False, False, True] and all(w.pipelined for w in k.windows)
    grid, bound = mosaic.grid_values(k, None)
    assert bound == max(s[0] for s, _ in k.prefetch if len(s) == 1) and bound in grid
    grid, bound = mosaic.grid_values(k, [np.int32(7)])
    assert bound is None and 7 in grid

    (_, calls, _) = program("paged_attention")
    k = mosaic.parse_kernel(calls[0])
    assert [w.memory_space for w in k.windows] == ["vmem", "any", "any", "vmem"]
    assert [w.pipelined for w in k.windows] == [True, False, False, True]
    assert any(s.dtype.endswith("dma_semaphore") and s.nbytes == 0 for s in k.scratch)
    assert k.dma_bytes > 0 and k.vmem_bytes == mosaic.kernel_features(calls[0]).vmem_bytes


def test_single_buffering_is_read_from_the_pipeline_mode():
    double = mosaic.kernel_features(program("gemm")[1][0])
    single = mosaic.kernel_features(program("gemm_single_buffered")[1][0])
    assert [w.buffers for w in mosaic.parse_kernel(program("gemm_single_buffered")[1][0]).inputs] == [1, 1]
    assert single.hbm_bytes == double.hbm_bytes and single.vmem_bytes < double.vmem_bytes
    assert sum(s * c for _, s, c in single.traffic) > 0 == sum(s * c for _, s, c in double.traffic)


# --- hand-made kernels ----------------------------------------------------------------------

ROWS, COLS = 512, 256


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def half_written(x):
    """Writes rows 0..255 of a 512-row output: the grid stops half-way."""
    return pl.pallas_call(
        _copy_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((128, COLS), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((128, COLS), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
    )(x)


def aliased_half_written(x):
    return pl.pallas_call(
        _copy_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((128, COLS), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((128, COLS), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
        input_output_aliases={0: 0},
    )(x)


def _hbm_copy_kernel(x_ref, o_ref, sem):
    pltpu.make_async_copy(x_ref, o_ref, sem).start()
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def hbm_output(x):
    return pl.pallas_call(
        _hbm_copy_kernel, grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
    )(x)


X = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)


def the_call(fn, *specs):
    _, (eqn,), (call,) = traced_and_exported(fn, *specs)
    return eqn, call


def test_coverage_flags_a_grid_that_writes_half_the_output():
    _, call = the_call(half_written, X)
    coverage = mosaic.output_coverage(call, [])
    assert coverage == ["output 0: 50% of its elements are never written (grid (2,), block (128, 256) of (512, 256))"]
    assert coverage.unverified == []


def every_other_block(x):
    """Blocks 0 and 2 of a 300-row output in 128-row blocks: the middle 128 rows stay unwritten."""
    return pl.pallas_call(
        _copy_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((128, COLS), lambda i: (2 * i, 0))],
        out_specs=pl.BlockSpec((128, COLS), lambda i: (2 * i, 0)),
        out_shape=jax.ShapeDtypeStruct((300, COLS), jnp.float32),
    )(x)


def without_grid(x):
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct((300, COLS), jnp.float32))(x)


def test_coverage_counts_the_ragged_last_block_and_grid_free_kernels():
    _, call = the_call(every_other_block, jax.ShapeDtypeStruct((300, COLS), jnp.float32))
    assert mosaic.output_coverage(call) == [
        "output 0: 42.7% of its elements are never written (grid (2,), block (128, 256) of (300, 256))"]
    eqn, call = the_call(without_grid, jax.ShapeDtypeStruct((300, COLS), jnp.float32))
    coverage = mosaic.output_coverage(call)
    assert coverage == [] and coverage.unverified == []
    assert_same_features(pallas.kernel_features(eqn), mosaic.kernel_features(call), call)
    assert mosaic.kernel_features(call).grid == ()


def test_coverage_leaves_aliased_and_hand_written_outputs_unverified():
    for fn in (aliased_half_written, hbm_output):
        _, call = the_call(fn, X)
        coverage = mosaic.output_coverage(call, [])
        assert coverage == [] and len(coverage.unverified) == 1, (fn.__name__, coverage.unverified)
    _, call = the_call(aliased_half_written, X)
    assert call.aliases == ((0, 0),) and "aliased" in mosaic.output_coverage(call).unverified[0]
    _, compiled = compile_for_v6e(aliased_half_written, [X])
    (compiled_call,) = mosaic.hlo_custom_calls(compiled.as_text())
    assert compiled_call.aliases == ((0, 0),)
    assert "HBM" in mosaic.output_coverage(the_call(hbm_output, X)[1]).unverified[0].upper()


STEPS, BLOCK = 24, 8


def _scrambled_kernel(t_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def scrambled(table, x):
    """Index maps with the integer ops jnp emits (floor division and modulo of negatives,
    min/max, comparisons and selects, shifts, bit ops) over the grid and a prefetched table."""
    def x_map(i, j, t):
        a = (t[i] - 5) // 3 + (j - 2) % 3
        b = jnp.where(i > j, jnp.minimum(i, 4) - j, jnp.maximum(j, 1) - i)
        return jnp.abs(a) % 4, (jnp.abs(b) ^ (i << 1) | (j >> 1)) & 3

    def o_map(i, j, t):
        return (t[(i + j) % STEPS] % (STEPS // BLOCK)) * 0 + i // BLOCK, 0

    return pl.pallas_call(
        _scrambled_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(STEPS, 3),
            in_specs=[pl.BlockSpec((8, 128), x_map)],
            out_specs=pl.BlockSpec((8, 128), o_map),
        ),
        out_shape=jax.ShapeDtypeStruct((STEPS // BLOCK * 8, 128), jnp.float32),
    )(table, x)


def test_index_maps_evaluate_like_the_jaxpr():
    table = (np.arange(STEPS, dtype=np.int32) * 7919) % 23 - 11
    eqn, call = the_call(scrambled, jax.ShapeDtypeStruct((STEPS,), jnp.int32),
                         jax.ShapeDtypeStruct((32, 512), jnp.float32))
    kernel = mosaic.parse_kernel(call)
    points = pallas.grid_points((STEPS, 3))
    for bm, window in zip(eqn.params["grid_mapping"].block_mappings, kernel.windows):
        want = pallas._block_indices(bm, points, [table])
        got = mosaic.block_indices(kernel, window, points, [table])
        np.testing.assert_array_equal(got, want)
        assert mosaic.block_indices(kernel, window, points, None) is None  # reads the table: unknown
    assert_same_features(pallas.kernel_features(eqn, [table]), mosaic.kernel_features(call, [table]), call)
    assert mosaic.output_coverage(call, [table]) == []


def test_unknown_ops_make_an_index_map_unevaluable():
    ret = ("func.return", (), (0,), {}, (), (32,))
    points = np.zeros((3, 1), np.int64)
    known = mosaic.Transform(1, (("arith.constant", (0,), (), {"value": 5}, (32,), ()), ret))
    unknown = mosaic.Transform(1, (("arith.mystery", (0,), (("arg", 0),), {}, (32,), (32,)), ret))
    np.testing.assert_array_equal(mosaic.evaluate_transform(known, points, None), [[5]] * 3)
    assert mosaic.evaluate_transform(unknown, points, None) is None


# The hand-copied gather kernel of the jaxpr path's tests, read here from its Mosaic module.
import test_sim as jaxpr_path  # noqa: E402


def test_hand_copied_kernel_matches_the_jaxpr():
    eqn, call = the_call(jaxpr_path.gather, jax.ShapeDtypeStruct((64,), jnp.int32),
                         jax.ShapeDtypeStruct((jaxpr_path.ROWS, jaxpr_path.COLS), jnp.float32))
    table = np.arange(64, dtype=np.int32)
    for p in (None, [table]):
        assert_same_features(pallas.kernel_features(eqn, p), mosaic.kernel_features(call, p), call)
    k = mosaic.kernel_features(call)
    assert k.manual_dma and k.steps == 16 and k.hbm_bytes == 16 * 2 * jaxpr_path.CHUNKS * jaxpr_path.CHUNK * jaxpr_path.COLS * 4


# --- whole programs, compiled: no jaxpr -----------------------------------------------------

SMALL = {"gemm": {"M": 1024, "K": 1024, "N": 2048}, "megablox_gmm": {"seq_len": 256}}


@functools.lru_cache(maxsize=None)
def compiled_program(name: str):
    """(compiled, exported, jaxpr, concrete prefetch by eqn id) of a small template program."""
    wl = workloads.get(name, SMALL[name])
    module = load_module(wl.template_source(), wl.config, {})
    specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
    closed = jax.jit(module.workload).trace(*specs).jaxpr
    exported = export_tpu(module.workload, *specs)
    dev = v6e_device()
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(dev))
            for a in exported.in_avals]
    with jax.default_device(dev):
        compiled = jax.jit(exported.call).trace(*args).lower().compile()
    return compiled, exported, closed, pallas.prefetch_operands(closed, lambda: wl.make_inputs(wl.config, 0))


@pytest.mark.parametrize("name", list(SMALL))
def test_program_features_need_no_jaxpr(name):
    compiled, exported, closed, by_eqn = compiled_program(name)
    text = compiled.as_text()
    hlo_calls = mosaic.hlo_custom_calls(text)
    exported_calls = mosaic.stablehlo_custom_calls(exported.mlir_module())
    order = mosaic.match_calls(hlo_calls, exported_calls)
    assert order == list(range(len(exported_calls)))
    for h, s in zip(hlo_calls, exported_calls):  # compiled HLO names its operands: their types are looked up
        assert [d for d, _ in h.operands] == [d for d, _ in s.operands] and h.results[0][0] == s.results[0][0]
    eqns = pallas.pallas_call_eqns(closed.jaxpr)
    prefetch = [by_eqn.get(id(eqns[j]), []) for j in order]

    pallas_calls = [c for c in hlo_calls if c.pallas]
    for tables in (None, prefetch):
        features = model.program_features(compiled, {}, tables)
        assert len(features.kernels) == len(eqns)
        # The jaxpr's reading of each kernel (the relaxed tier's) agrees with the Mosaic module's.
        from_jaxpr = [pallas.kernel_features(eqns[j], prefetch[i] if tables else None) for i, j in enumerate(order)]
        for a, b, call in zip(from_jaxpr, features.kernels, pallas_calls):
            assert_same_features(a, b, call)
        assert not {c.name for c in hlo_calls} & {o.name for o in features.ops}  # kernels are not XLA ops
        sim = model.predict_program(compiled, V6E, {}, tables)
        for a, b in zip(from_jaxpr, features.kernels):
            a.times = b.times
        analytic = model.price(dataclasses.replace(features, kernels=from_jaxpr)).time_s
        branches = any(it.kind == "arm" for c in pallas_calls for it in mosaic.parse_kernel(c).body.items)
        if branches:  # the Mosaic path charges only the branch sides that run
            assert 0 < sim.time_s <= analytic * 1.01
        else:
            assert sim.time_s > 0 and sim.time_s == pytest.approx(analytic, rel=0.01)
    with pytest.raises(ValueError):
        model.program_features(compiled, {}, prefetch + [[]])
