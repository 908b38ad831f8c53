"""Tiled matmul C = A @ B as a Pallas TPU kernel: an f32 VMEM accumulator over the K steps,
or, with the whole contraction in one step (accumulator "none"), each output block written
straight from its dot."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_m": 512, "block_k": 1024, "block_n": 1024, "buffers": 2, "order": "mn", "accumulator": "vmem"}
VMEM_LIMIT = 100 * 2**20  # above the 32 MiB default, so whole-K blocks fit; v6e has 128 MiB


def whole_k_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk", "bn", "buffers", "order", "whole_k"))
def matmul(a, b, *, bm, bk, bn, buffers, order, whole_k):
    m, k = a.shape
    _, n = b.shape
    bk = k if whole_k else bk  # the knob decides, never the sizes: one program at every size
    if order == "mn":
        grid = (m // bm, n // bn, k // bk)
        ij = lambda g0, g1: (g0, g1)
    else:  # walk N in the outer loop: B's column panel stays put while A streams
        grid = (n // bn, m // bm, k // bk)
        ij = lambda g0, g1: (g1, g0)
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    return pl.pallas_call(
        whole_k_kernel if whole_k else matmul_kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((bm, bk), lambda g0, g1, kk: (ij(g0, g1)[0], kk), **pipeline),
            pl.BlockSpec((bk, bn), lambda g0, g1, kk: (kk, ij(g0, g1)[1]), **pipeline),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda g0, g1, kk: ij(g0, g1)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[] if whole_k else [pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(a, b)


def workload(a, b):
    s = SCHEDULE
    return matmul(a, b, bm=s["block_m"], bk=s["block_k"], bn=s["block_n"], buffers=s["buffers"], order=s["order"],
                  whole_k=s["accumulator"] == "none")
