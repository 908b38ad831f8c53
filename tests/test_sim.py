"""The simulator on kernels that copy by hand and on grids sized at run time (trace only,
no compile): HBM operands take no VMEM and no pipeline traffic, semaphores take no bytes,
``dma_start`` copies count per loop trip, a data-dependent grid axis gets an upper bound."""

from jaxbench_env.aot import prepare_process

prepare_process()

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import workloads  # noqa: E402
from jaxbench_env.candidate_process import load_module  # noqa: E402
from jaxbench_env.sim import V6E, calibration  # noqa: E402
from jaxbench_env.sim.model import price_kernel  # noqa: E402
from jaxbench_env.sim.pallas import body_work, kernel_features, pallas_call_eqns, static_grid, vmem_estimate  # noqa: E402

ROWS, COLS, CHUNK, CHUNKS = 4096, 128, 8, 4


def gather_kernel(table_ref, src_hbm, o_ref, buf, sem):
    # Copies CHUNKS chunks of CHUNK rows, chosen by the prefetched table, then stores them.
    def copy(c, carry):
        row = table_ref[pl.program_id(0) * CHUNKS + c] * CHUNK
        pltpu.make_async_copy(src_hbm.at[pl.ds(row, CHUNK)], buf.at[pl.ds(c * CHUNK, CHUNK)], sem).start()
        pltpu.make_async_copy(src_hbm.at[pl.ds(row, CHUNK)], buf.at[pl.ds(c * CHUNK, CHUNK)], sem).wait()
        return carry

    jax.lax.fori_loop(0, CHUNKS, copy, 0)
    o_ref[...] = buf[...]


@functools.partial(jax.jit)
def gather(table, src):
    steps = table.shape[0] // CHUNKS
    return pl.pallas_call(
        gather_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((CHUNK * CHUNKS, COLS), lambda i, t: (i, 0)),
            scratch_shapes=[pltpu.VMEM((CHUNK * CHUNKS, COLS), jnp.float32), pltpu.SemaphoreType.DMA],
        ),
        out_shape=jax.ShapeDtypeStruct((steps * CHUNK * CHUNKS, COLS), jnp.float32),
    )(table, src)


def the_eqn(fn, *specs):
    (eqn,) = pallas_call_eqns(jax.jit(fn).trace(*specs).jaxpr.jaxpr)
    return eqn


def test_hand_copied_kernel_is_priced_by_its_copies():
    eqn = the_eqn(gather, jax.ShapeDtypeStruct((64,), jnp.int32), jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32))
    chunk_bytes = CHUNK * COLS * 4
    # VMEM: the double-buffered output block and the scratch buffer; not the 2 MiB HBM source.
    assert vmem_estimate(eqn) == 2 * CHUNKS * chunk_bytes + CHUNKS * chunk_bytes
    *_, dma = body_work(eqn.params["jaxpr"])
    assert dma == CHUNKS * chunk_bytes  # one copy per fori_loop trip
    k = kernel_features(eqn)
    # 16 steps, each copying CHUNKS chunks in and writing one output block back.
    assert k.steps == 16 and k.hbm_bytes == 16 * 2 * CHUNKS * chunk_bytes


def test_data_dependent_grid_axis_gets_the_table_bound():
    wl = workloads.get("megablox_gmm")
    module = load_module(wl.expert_source(), wl.config, {})
    specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
    (eqn,) = pallas_call_eqns(jax.jit(module.workload).trace(*specs).jaxpr.jaxpr)
    grid, bound = static_grid(eqn)
    # megablox's tile schedule has at most (row tiles + groups - 1) entries: 128 + 128 - 1.
    assert bound == 255 and 255 in grid and all(isinstance(g, int) for g in grid)
    assert price_kernel(kernel_features(eqn), V6E, calibration())["time_s"] > 0
