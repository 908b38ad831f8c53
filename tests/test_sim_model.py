"""The v6e simulator's known behaviour: its inputs (chip table, HLO bytes, bundle dumps) and
the shapes of its predictions (blocks, re-fetches, buffering, memory-bound kernels)."""

from jaxbench_env.aot import prepare_process

prepare_process()

import functools  # noqa: E402
import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import workloads  # noqa: E402
from harness import judged_time_only  # noqa: E402
from jaxbench_env import calibrate  # noqa: E402
from jaxbench_env.sim import V5E, V6E, bundles, calibration, hlo  # noqa: E402
from jaxbench_env.sim.model import OpFeatures, price_kernel, price_op  # noqa: E402
from jaxbench_env.sim.pallas import kernel_features, pallas_call_eqns  # noqa: E402


def test_chip_constants_are_jax_chip_table():
    for chip in (V6E, V5E):
        info = pltpu.get_tpu_info_for_chip(getattr(pltpu.ChipVersion, chip.chip_version), 1)
        assert chip.mxu_flops_per_s == info.bf16_ops_per_second
        assert chip.hbm_bytes_per_s == info.mem_bw_bytes_per_second
        assert chip.vmem_bytes == info.vmem_capacity_bytes
        assert (chip.mxus, chip.mxu_size) == (info.num_mxus, info.mxu_column_size)


def test_hlo_bytes_pad_tiles_and_skip_vmem():
    # A 62-wide bf16 row pads to 128 lanes and 16-row tiles; S(1) arrays live in VMEM.
    assert hlo.shape_bytes("bf16[30,62]{1,0:T(8,128)(2,1)}") == 32 * 128 * 2
    assert hlo.shape_bytes("f32[8192]{0:T(1024)S(1)}") == 0
    assert hlo.shape_bytes("(f32[8]{0:T(1024)}, bf16[4,128]{1,0})") == 1024 * 4 + 4 * 128 * 2


def test_bundle_parser_finds_loops_and_trips():
    text = "\n".join([
        "  0x0   :  { %1 = vsyncpa }",
        "  0x1 LB: > { %2 = sadd.s32 1, %s3 }",
        "  0x2   : > { %4 = vmatmul }",
        "  0x3   : > { %p5 = scmp.ge.s32.totalorder %s6_s1, 10 /* loop exit test */ }",
        "  0x4   :  { %7 = vsyncpa }",
    ])
    p = bundles.parse(text)
    assert p.static == 5 and p.dynamic == 2 + 3 * 10
    assert p.per_iteration() == (2.0, 3.0, 10)
    assert bundles.parse("no bundles here") is None


def test_a_child_process_dumps_bundles_into_its_own_directory():
    # A pytest-xdist worker or subprocess inherits its parent's LIBTPU_INIT_ARGS; sharing the
    # parent's dump directory would leave the child's compiles unpriced by their bundles.
    import os
    import subprocess
    import sys

    parent = bundles.enable()
    assert parent is not None and str(parent) in os.environ["LIBTPU_INIT_ARGS"]
    code = ("import os; from jaxbench_env.sim import bundles; d = bundles.enable(); "
            "print(d, os.environ['LIBTPU_INIT_ARGS'].count('--xla_jf_dump_to='))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child, count = out.stdout.split()
    assert child not in ("None", str(parent)) and count == "1"


@functools.lru_cache(maxsize=None)
def _predict(name, config, schedule):
    """(sim details, error) of a workload's template at a schedule: compiled for v6e, not checked."""
    wl = workloads.get(name, dict(config))
    result = judged_time_only(wl, wl.template_source(), dict(schedule))
    if result["error"]:
        return None, result["error"]
    return result["details"]["sim"], None


GEMM = (("M", 2048), ("K", 2048), ("N", 2048))


def gemm_ms(block, buffers=2):
    sim, error = _predict("gemm", GEMM, (("block_m", block), ("block_k", block), ("block_n", block),
                                         ("buffers", buffers), ("order", "mn")))
    assert error is None, error
    return sim["time_s"] * 1e3, sim


def test_gemm_time_falls_as_blocks_grow():
    times = {b: gemm_ms(b)[0] for b in (128, 256, 512)}
    assert times[128] > times[256] > times[512]
    assert times[128] > 3 * times[512]  # 128-wide steps are overhead- and DMA-bound
    _, sim = gemm_ms(512)
    assert sim["kernels"][0]["compute_from"] == "bundles"  # read from the compiled kernel


def test_gemm_blocks_over_vmem_are_rejected():
    wl = workloads.get("gemm", dict(GEMM))
    # The space would mask these blocks; a source with a smaller scoped limit gets them past it.
    source = wl.template_source().replace("VMEM_LIMIT = 100 * 2**20", "VMEM_LIMIT = 16 * 2**20")
    assert "VMEM_LIMIT = 16 * 2**20" in source
    result = judged_time_only(wl, source, {"block_m": 2048, "block_n": 2048, "block_k": 2048})
    assert not result["compiled"] and "VMEM" in result["error"], result["error"]


def test_whole_contraction_gemm_is_correct_and_drops_the_accumulator():
    from harness import assert_template_correct

    assert_template_correct(workloads.get("gemm"), {"accumulator": "none"})  # interpret mode, check size
    blocks = (("block_m", 1024), ("block_k", 512), ("block_n", 512), ("buffers", 2), ("order", "mn"))
    summed, error = _predict("gemm", GEMM, blocks + (("accumulator", "vmem"),))
    assert error is None, error
    whole, error = _predict("gemm", GEMM, blocks + (("accumulator", "none"),))
    assert error is None, error
    (k_summed,), (k_whole,) = summed["kernels"], whole["kernels"]
    assert k_summed["grid"] == [2, 4, 4] and k_whole["grid"] == [2, 4, 1]
    # No f32 tile read and written back at each K step, fewer copies (A stays put across N).
    assert k_whole["compute_s"] < k_summed["compute_s"] and k_whole["hbm_bytes"] < k_summed["hbm_bytes"]
    assert whole["time_s"] < summed["time_s"]


def test_no_kernel_computes_faster_than_the_mxu_peak():
    """The fitted clock is an effective one: a kernel whose bundles alone would run its
    matmuls above the chip's peak is priced at the peak."""
    from jaxbench_env.sim.pallas import KernelFeatures

    cal, steps, flops = calibration(), 64, 2.0 * 1024 * 1024 * 8192
    at_peak = flops / V6E.mxu_flops_per_s

    def kernel(bundles_per_step):
        return KernelFeatures(name="k", grid=(steps,), steps=steps, traffic=[[0.0, 0.0, steps]], fill_bytes=0.0,
                              drain_bytes=0.0, hbm_bytes=0.0, flops=flops, vector_ops=0.0, transcendentals=0.0,
                              vmem_bytes=0, out_shapes=((1024, 1024),), bundles_per_step=bundles_per_step)

    fast = 0.5 * at_peak * cal.bundle_rate_hz  # bundles that would take half the peak's time
    slow = 2.0 * at_peak * cal.bundle_rate_hz
    assert price_kernel(kernel(fast), V6E, cal)["compute_s"] == pytest.approx(steps * at_peak)
    assert price_kernel(kernel(slow), V6E, cal)["compute_s"] == pytest.approx(2 * steps * at_peak)


def test_no_xla_op_computes_faster_than_the_mxu_peak():
    """Nor an XLA op: the matmul fusion of ``mask * (x @ y)`` on v5e issues bundles the
    v6e-fitted clock would run in 0.66 of its measured time, under the MXUs' peak."""
    cal, flops = calibration(), 2.0 * 4096**3
    at_peak = flops / V6E.mxu_flops_per_s

    def op(bundles, op_flops):
        return OpFeatures("fusion", "fusion", hbm_bytes=0.0, times=3, bundles=bundles, estimated_cycles=None,
                          flops=op_flops)

    fast, slow = 0.5 * at_peak * cal.bundle_rate_hz, 2.0 * at_peak * cal.bundle_rate_hz
    assert price_op(op(fast, flops), V6E, cal) == pytest.approx(3 * (cal.op_overhead_s + at_peak))
    assert price_op(op(slow, flops), V6E, cal) == pytest.approx(3 * (cal.op_overhead_s + 2 * at_peak))
    assert price_op(op(fast, 0.0), V6E, cal) == pytest.approx(3 * (cal.op_overhead_s + 0.5 * at_peak))


def test_memory_bound_rmsnorm_lands_near_bytes_over_bandwidth():
    config = (("batch", 2), ("seq_len", 4096))
    sim, error = _predict("rmsnorm", config, (("block_rows", 128), ("buffers", 2)))
    assert error is None, error
    wl = workloads.get("rmsnorm", dict(config))
    x = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))[0]
    nbytes = 2 * math.prod(x.shape) * x.dtype.itemsize  # read x, write the output
    ideal = nbytes / (V6E.hbm_bytes_per_s * calibration().hbm_efficiency)
    assert ideal <= sim["time_s"] <= 1.3 * ideal


ROWS, WIDTH, STEPS = 512, 1024, 64


def _add_rows(w_index_map=lambda i: (0, 0), x_buffers=2, body=lambda x, w: x + w):
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = body(x_ref[...], w_ref[...])

    x_mode = {} if x_buffers == 2 else {"pipeline_mode": pl.Buffered(x_buffers)}

    def f(x, w):
        return pl.pallas_call(
            kernel, grid=(STEPS,),
            in_specs=[pl.BlockSpec((ROWS, WIDTH), lambda i: (i, 0), **x_mode),
                      pl.BlockSpec((ROWS, WIDTH), w_index_map)],
            out_specs=pl.BlockSpec((ROWS, WIDTH), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((STEPS * ROWS, WIDTH), jnp.float32),
        )(x, w)

    specs = (jax.ShapeDtypeStruct((STEPS * ROWS, WIDTH), jnp.float32),
             jax.ShapeDtypeStruct((2 * ROWS, WIDTH), jnp.float32))
    (eqn,) = pallas_call_eqns(jax.jit(f).trace(*specs).jaxpr.jaxpr)
    return kernel_features(eqn)


def test_refetch_free_index_map_saves_dma():
    block = ROWS * WIDTH * 4
    once = _add_rows(lambda i: (0, 0))  # the same block every step: fetched once
    every = _add_rows(lambda i: (i % 2, 0))  # alternating blocks: fetched every step
    assert once.hbm_bytes == (2 * STEPS + 1) * block
    assert every.hbm_bytes == 3 * STEPS * block
    cal = calibration()
    assert price_kernel(once, V6E, cal)["time_s"] < price_kernel(every, V6E, cal)["time_s"]


def test_published_rows_map_onto_the_suite():
    rows = calibrate.published_rows()
    assert rows and all(r.workload in workloads.WORKLOADS for r in rows)
    assert not any("stale" in r.note for r in rows)
    assert {r.variant for r in rows} == {"baseline", "optimized"}
    assert len(calibrate.published_rows(include_stale=True)) > len(rows)


@pytest.mark.slow
def test_shipped_constants_predict_published_kernelbench_baselines(tmp_path):
    # Re-derives a few rows from scratch (compile, features, price) with the shipped fit.
    rows = [r for r in calibrate.published_rows() if r.jaxbench_id in ("19k", "33k")]
    calibrate.gather(rows, cache_dir=tmp_path)
    rep = calibrate.report(rows, calibration())
    assert all(abs(t["log_error"]) < math.log(1.5) for t in rep["rows"]), rep["rows"]
    sim_err = rep["simulator"]["median_abs_log_error"]
    assert sim_err < rep["optimal_seconds"]["median_abs_log_error"]  # on the same rows here


def test_single_buffering_stops_the_copies_hiding_behind_compute():
    def heavy(x, w):  # enough transcendental work per step to hide a block's copy
        for _ in range(24):
            x = jnp.tanh(x) * w
        return x

    cal = calibration()
    double = _add_rows(x_buffers=2, body=heavy)
    single = _add_rows(x_buffers=1, body=heavy)
    assert single.hbm_bytes == double.hbm_bytes and single.vmem_bytes < double.vmem_bytes
    t2, t1 = (price_kernel(k, V6E, cal) for k in (double, single))
    assert t2["compute_s"] > t2["dma_s"]  # compute-bound: double buffering hides every copy
    x_copies = STEPS * ROWS * WIDTH * 4 / (V6E.hbm_bytes_per_s * cal.hbm_efficiency)
    assert t1["time_s"] == pytest.approx(t2["time_s"] + x_copies, rel=0.05)


def test_a_short_step_costs_the_copy_latency_whatever_its_bundles():
    # The Pallas matmul guide on v5e: 128^3 blocks run ~175 bundles (~0.1 us) a step and
    # take 0.35 us a step; 512/1024/1024 blocks take their bundles' time.
    from jaxbench_env.sim.model import step_s

    p, latency = calibration().overlap, 0.35e-6
    assert step_s(0.05e-6, 0.08e-6, 0.0, latency, p) == pytest.approx(latency, rel=0.02)
    assert step_s(5e-6, 1e-6, 0.0, latency, p) == pytest.approx(5e-6, rel=0.02)
    # a single-buffered copy waits in line
    assert step_s(0.05e-6, 0.0, 2e-6, latency, p) == pytest.approx(2e-6, rel=0.03)
    assert step_s(0.05e-6, 0.0, 2e-6, latency, p) > step_s(0.05e-6, 2e-6, 0.0, latency, p)


def _blocked_matmul_body(k_steps):
    def body(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == k_steps - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return body


def test_copies_a_kernel_pipelines_itself_are_charged_once():
    """One grid step running its own pipeline (``emit_pipeline``: every copy hand-issued) is
    priced like the gridded kernel with the same blocks: its copies count in the step that
    issues them, not again as an unhidden pipeline fill."""
    from jaxbench_env import validation

    n, b = 2048, 512
    grid = (n // b, n // b, n // b)
    specs = dict(in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)), pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
                 out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)))
    body = _blocked_matmul_body(grid[2])
    out = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)

    def gridded(x, y):
        return pl.pallas_call(body, out_shape=out, grid=grid, scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
                              **specs)(x, y)

    def self_pipelined(x, y):
        def kernel(x_hbm, y_hbm, o_hbm):
            def run(acc_ref):
                pltpu.emit_pipeline(lambda x_ref, y_ref, o_ref: body(x_ref, y_ref, o_ref, acc_ref), grid=grid,
                                    **specs)(x_hbm, y_hbm, o_hbm)

            pl.run_scoped(run, pltpu.VMEM((b, b), jnp.float32))

        anywhere = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(kernel, out_shape=out, in_specs=[anywhere, anywhere], out_specs=anywhere)(x, y)

    args = [jax.ShapeDtypeStruct((n, n), jnp.bfloat16)] * 2
    priced = {f.__name__: validation.predict_exported(validation.export_tpu(f, args), None, "v6e")
              for f in (gridded, self_pipelined)}
    [own] = priced["self_pipelined"]["features"]["kernels"]
    assert own["steps"] == 1 and own["manual_dma"] and own["fill_bytes"] == 0.0
    [grid_kernel] = priced["gridded"]["kernels"]
    assert own["hbm_bytes"] == pytest.approx(grid_kernel["hbm_bytes"], rel=0.01)
    assert 0.8 < priced["self_pipelined"]["time_s"] / priced["gridded"]["time_s"] < 1.25
