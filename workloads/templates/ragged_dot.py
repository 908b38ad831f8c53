"""Uniform grouped matmul out[g] = x[g] @ weights[g] as a Pallas TPU kernel.

The grid walks (group, row blocks, column blocks, K blocks); each output block keeps an
f32 VMEM accumulator over the K steps, or, with the whole contraction in one step
(accumulator "none"), is written straight from its dot. The group axis selects both x's
and the weights' block, so one pallas_call covers every group.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_m": 512, "block_k": 1024, "block_n": 1024, "buffers": 2, "accumulator": "vmem"}
VMEM_LIMIT = 100 * 2**20  # above the 32 MiB default, so whole-K blocks fit; v6e has 128 MiB


def whole_k_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def grouped_matmul_kernel(x_ref, w_ref, o_ref, acc_ref):
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk", "bn", "buffers", "whole_k"))
def grouped_matmul(x, w, *, bm, bk, bn, buffers, whole_k):
    g, m, k = x.shape
    _, _, n = w.shape
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    bk = k if whole_k else bk  # the knob decides, never the sizes: one program at every size
    return pl.pallas_call(
        whole_k_kernel if whole_k else grouped_matmul_kernel,
        grid=(g, m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((None, bm, bk), lambda gg, i, j, kk: (gg, i, kk), **pipeline),
            pl.BlockSpec((None, bk, bn), lambda gg, i, j, kk: (gg, kk, j), **pipeline),
        ],
        out_specs=pl.BlockSpec((None, bm, bn), lambda gg, i, j, kk: (gg, i, j)),
        out_shape=jax.ShapeDtypeStruct((g, m, n), x.dtype),
        scratch_shapes=[] if whole_k else [pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(x, w)


def workload(x, weights):
    s = SCHEDULE
    return grouped_matmul(x, weights, bm=s["block_m"], bk=s["block_k"], bn=s["block_n"], buffers=s["buffers"],
                          whole_k=s["accumulator"] == "none")
