"""SwiGLU MLP (silu(x @ gate) * (x @ up)) @ down as two Pallas TPU kernels.

x (..., E) is flattened to (tokens, E). Kernel 1 tiles (tokens, mlp, emb) and keeps two
f32 VMEM accumulators, for x @ gate and x @ up; on the last emb step it writes
h = silu(x @ gate) * (x @ up) in bf16 (with accumulator "none", the whole emb_dim in one
step and no accumulators). Kernel 2 is a tiled matmul h @ down over
(tokens, emb, mlp) with an f32 accumulator.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_tokens": 512, "block_mlp": 512, "block_emb": 1024, "buffers": 2, "accumulator": "vmem"}
VMEM_LIMIT = 100 * 2**20  # above the 32 MiB default, so whole-emb_dim blocks fit; v6e has 128 MiB


def silu_gate(h_ref, g, u):
    g = g.astype(h_ref.dtype).astype(jnp.float32)  # rounded as the reference's bf16 matmuls are
    u = u.astype(h_ref.dtype).astype(jnp.float32)
    h_ref[...] = (g * jax.nn.sigmoid(g) * u).astype(h_ref.dtype)


def whole_emb_kernel(x_ref, g_ref, u_ref, h_ref):
    x = x_ref[...]
    silu_gate(h_ref, jnp.dot(x, g_ref[...], preferred_element_type=jnp.float32),
              jnp.dot(x, u_ref[...], preferred_element_type=jnp.float32))


def gate_up_kernel(x_ref, g_ref, u_ref, h_ref, accg_ref, accu_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        accg_ref[...] = jnp.zeros_like(accg_ref)
        accu_ref[...] = jnp.zeros_like(accu_ref)

    x = x_ref[...]
    accg_ref[...] += jnp.dot(x, g_ref[...], preferred_element_type=jnp.float32)
    accu_ref[...] += jnp.dot(x, u_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        silu_gate(h_ref, accg_ref[...], accu_ref[...])


def down_kernel(h_ref, d_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(h_ref[...], d_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bt", "bf", "be", "buffers", "whole_emb"))
def swiglu(x, gate, up, down, *, bt, bf, be, buffers, whole_emb):
    shape = x.shape
    e = shape[-1]
    f = gate.shape[1]
    x2 = x.reshape(-1, e)
    t = x2.shape[0]
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                  vmem_limit_bytes=VMEM_LIMIT)
    be1 = e if whole_emb else be  # kernel 1's contraction depth
    h = pl.pallas_call(
        whole_emb_kernel if whole_emb else gate_up_kernel,
        grid=(t // bt, f // bf, e // be1),
        in_specs=[
            pl.BlockSpec((bt, be1), lambda i, j, k: (i, k), **pipeline),
            pl.BlockSpec((be1, bf), lambda i, j, k: (k, j), **pipeline),
            pl.BlockSpec((be1, bf), lambda i, j, k: (k, j), **pipeline),
        ],
        out_specs=pl.BlockSpec((bt, bf), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((t, f), x.dtype),
        scratch_shapes=[] if whole_emb else [pltpu.VMEM((bt, bf), jnp.float32), pltpu.VMEM((bt, bf), jnp.float32)],
        compiler_params=params,
    )(x2, gate, up)
    out = pl.pallas_call(
        down_kernel,
        grid=(t // bt, e // be, f // bf),
        in_specs=[
            pl.BlockSpec((bt, bf), lambda i, j, k: (i, k), **pipeline),
            pl.BlockSpec((bf, be), lambda i, j, k: (k, j), **pipeline),
        ],
        out_specs=pl.BlockSpec((bt, be), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((t, e), x.dtype),
        scratch_shapes=[pltpu.VMEM((bt, be), jnp.float32)],
        compiler_params=params,
    )(h, down)
    return out.reshape(shape)


def workload(x, gate, up, down):
    s = SCHEDULE
    return swiglu(x, gate, up, down, bt=s["block_tokens"], bf=s["block_mlp"], be=s["block_emb"],
                  buffers=s["buffers"], whole_emb=s["accumulator"] == "none")
