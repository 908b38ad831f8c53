"""AlphaFold2's outgoing triangle multiplication as three Pallas TPU kernels.

The triangle contraction T[i, j, c] = sum_k L[i, k, c] * R[j, k, c] is, per channel c, the
matmul L[:, :, c] @ R[:, :, c]^T, so it wants channels leading, while the pair tensor has
them last. The kernels change layout in VMEM instead of through HBM:

1. projection: over blocks of pair rows (i, j flattened), one (rows, C) x (C, 4C) matmul
   gives the left/right projections and gates; L and R are gated in f32 and stored
   transposed, channel-major (C, N*N).
2. triangle: grid (channel blocks, i blocks, j blocks, k blocks); each step multiplies
   block_c channels' (i, k) and (j, k) tiles as one batched matmul into an f32 VMEM
   accumulator, written in bf16 on the last k step.
3. epilogue: over blocks of pair rows, T is transposed back to (rows, C), RMS-normalised
   over channels, scaled, projected and gated by sigmoid(pair_act @ out_gate).

L, R and T are stored in bf16 as in the reference; the arithmetic in between is f32.
Blocks larger than N are capped at N.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_rows": 2048, "block_c": 8, "block_i": 128, "block_j": 128, "block_k": 128, "buffers": 2}

NORM_EPS = 1e-6


def projection_kernel(act_ref, mask_ref, w_ref, left_ref, right_ref):
    channels = left_ref.shape[0]
    act = act_ref[...] * mask_ref[...]
    p = jnp.dot(act, w_ref[...], preferred_element_type=jnp.float32)  # (rows, 4C)
    left = p[:, :channels] * jax.nn.sigmoid(p[:, channels:2 * channels])
    right = p[:, 2 * channels:3 * channels] * jax.nn.sigmoid(p[:, 3 * channels:])
    left_ref[...] = left.T.astype(left_ref.dtype)
    right_ref[...] = right.T.astype(right_ref.dtype)


def triangle_kernel(left_ref, right_ref, out_ref, acc_ref):
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # (c, i, k) x (c, j, k) -> (c, i, j): batch over channels, contract k.
    acc_ref[...] += jax.lax.dot_general(left_ref[...], right_ref[...], (((2,), (2,)), ((0,), (0,))),
                                        preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(3) - 1)
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def epilogue_kernel(t_ref, act_ref, scale_ref, out_proj_ref, out_gate_ref, out_ref):
    t = t_ref[...].astype(jnp.float32).T  # (rows, C)
    t = t * jax.lax.rsqrt(jnp.mean(t * t, axis=1, keepdims=True) + NORM_EPS) * scale_ref[...].astype(jnp.float32)
    projected = jnp.dot(t.astype(out_proj_ref.dtype), out_proj_ref[...], preferred_element_type=jnp.float32)
    gate = jnp.dot(act_ref[...], out_gate_ref[...], preferred_element_type=jnp.float32)
    out_ref[...] = (projected * jax.nn.sigmoid(gate)).astype(out_ref.dtype)


def _whole(r):
    return 0, 0


def _pipeline(buffers):
    return {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}


@functools.partial(jax.jit, static_argnames=("br", "buffers"))
def project(act, mask, weights, *, br, buffers):
    """act, mask: (P, C), (P, 1) pair rows; weights (C, 4C) -> L, R channel-major (C, P)."""
    rows, channels = act.shape
    return pl.pallas_call(
        projection_kernel,
        grid=(rows // br,),
        in_specs=[
            pl.BlockSpec((br, channels), lambda r: (r, 0), **_pipeline(buffers)),
            pl.BlockSpec((br, 1), lambda r: (r, 0)),
            pl.BlockSpec(weights.shape, _whole),
        ],
        out_specs=[pl.BlockSpec((channels, br), lambda r: (0, r))] * 2,
        out_shape=[jax.ShapeDtypeStruct((channels, rows), act.dtype)] * 2,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(act, mask, weights)


@functools.partial(jax.jit, static_argnames=("bc", "bi", "bj", "bk", "buffers"))
def triangle_contraction(left_c, right_c, *, bc, bi, bj, bk, buffers):
    """T_c[c, i, j] = sum_k left_c[c, i, k] * right_c[c, j, k], channel-major (C, N, N)."""
    channels, n, _ = left_c.shape
    return pl.pallas_call(
        triangle_kernel,
        grid=(channels // bc, n // bi, n // bj, n // bk),
        in_specs=[
            pl.BlockSpec((bc, bi, bk), lambda c, i, j, k: (c, i, k), **_pipeline(buffers)),
            pl.BlockSpec((bc, bj, bk), lambda c, i, j, k: (c, j, k), **_pipeline(buffers)),
        ],
        out_specs=pl.BlockSpec((bc, bi, bj), lambda c, i, j, k: (c, i, j)),
        out_shape=jax.ShapeDtypeStruct((channels, n, n), left_c.dtype),
        scratch_shapes=[pltpu.VMEM((bc, bi, bj), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(left_c, right_c)


@functools.partial(jax.jit, static_argnames=("br", "buffers"))
def epilogue(t_c, act, center_scale, out_proj, out_gate, *, br, buffers):
    """t_c (C, P) channel-major, act (P, C) -> gated output projection of the normalised T, (P, C)."""
    channels, rows = t_c.shape
    return pl.pallas_call(
        epilogue_kernel,
        grid=(rows // br,),
        in_specs=[
            pl.BlockSpec((channels, br), lambda r: (0, r), **_pipeline(buffers)),
            pl.BlockSpec((br, channels), lambda r: (r, 0), **_pipeline(buffers)),
            pl.BlockSpec((1, channels), _whole),
            pl.BlockSpec(out_proj.shape, _whole),
            pl.BlockSpec(out_gate.shape, _whole),
        ],
        out_specs=pl.BlockSpec((br, channels), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, channels), act.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(t_c, act, center_scale.reshape(1, channels), out_proj, out_gate)


def workload(pair_act, mask, left_proj, right_proj, left_gate, right_gate, center_scale, out_proj, out_gate):
    s = SCHEDULE
    n, _, channels = pair_act.shape
    rows = n * n
    act = pair_act.reshape(rows, channels)
    weights = jnp.concatenate([left_proj, left_gate, right_proj, right_gate], axis=1)
    left_c, right_c = project(act, mask.reshape(rows, 1), weights, br=min(s["block_rows"], rows),
                              buffers=s["buffers"])
    t_c = triangle_contraction(
        left_c.reshape(channels, n, n), right_c.reshape(channels, n, n), bc=s["block_c"],
        bi=min(s["block_i"], n), bj=min(s["block_j"], n), bk=min(s["block_k"], n), buffers=s["buffers"])
    out = epilogue(t_c.reshape(channels, rows), act, center_scale, out_proj, out_gate,
                   br=min(s["block_rows"], rows), buffers=s["buffers"])
    return out.reshape(n, n, channels)
