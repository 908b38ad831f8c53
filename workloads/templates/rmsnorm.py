"""RMSNorm as a Pallas TPU kernel: each grid step normalises a block of whole rows.

x (..., E) is flattened to (rows, E); a row's mean of squares needs the full E, so only
the rows are tiled. In f32: x * rsqrt(mean(x^2) + eps), cast to x's dtype, times scale.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_rows": 128, "buffers": 2}


def rmsnorm_kernel(x_ref, scale_ref, o_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    normed = (x * jax.lax.rsqrt(ms + eps)).astype(o_ref.dtype)
    o_ref[...] = normed * scale_ref[...]


@functools.partial(jax.jit, static_argnames=("eps", "block_rows", "buffers"))
def rmsnorm(x, scale, *, eps, block_rows, buffers):
    shape = x.shape
    emb = shape[-1]
    x2 = x.reshape(-1, emb)
    rows = x2.shape[0]
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    out = pl.pallas_call(
        functools.partial(rmsnorm_kernel, eps=eps),
        grid=(rows // block_rows,),
        in_specs=[
            pl.BlockSpec((block_rows, emb), lambda i: (i, 0), **pipeline),
            pl.BlockSpec((1, emb), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((block_rows, emb), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, emb), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x2, scale.reshape(1, emb))
    return out.reshape(shape)


def workload(x, scale):
    s = SCHEDULE
    return rmsnorm(x, scale, eps=float(CONFIG["epsilon"]), block_rows=s["block_rows"], buffers=s["buffers"])
