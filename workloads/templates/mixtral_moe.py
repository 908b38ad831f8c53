"""Mixtral MoE (top-k routing, every expert computed densely) with a fused Pallas expert FFN.

Routing is plain JAX: logits = x @ router, top-k, softmax over the k selected logits, and
the per-token expert weights w (tokens, experts) in f32. One pallas_call then walks the
grid (token blocks, experts, mlp blocks) and accumulates, in an f32 VMEM scratch,
    out[t] = sum_e w[t, e] * (silu(x[t] @ gate_e) * (x[t] @ up_e)) @ down_e
one mlp block at a time. The output is f32, like the reference.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_tokens": 256, "block_mlp": 256, "buffers": 2}
VMEM_LIMIT = 100 * 2**20  # the scoped VMEM the kernel may use: v6e has 128 MiB


def moe_kernel(x_ref, w_ref, gate_ref, up_ref, down_ref, o_ref, acc_ref):
    e = pl.program_id(1)
    f = pl.program_id(2)

    @pl.when((e == 0) & (f == 0))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...]
    g = jnp.dot(x, gate_ref[...], preferred_element_type=jnp.float32)
    u = jnp.dot(x, up_ref[...], preferred_element_type=jnp.float32)
    h = (g * jax.nn.sigmoid(g) * u).astype(down_ref.dtype)
    y = jnp.dot(h, down_ref[...], preferred_element_type=jnp.float32)
    acc_ref[...] += w_ref[...] * y  # (bt, 1) expert weight of each token

    @pl.when((e == pl.num_programs(1) - 1) & (f == pl.num_programs(2) - 1))
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bt", "bf", "buffers"))
def moe_experts(x, weights, gate, up, down, *, bt, bf, buffers):
    """x (T, D); weights (E, T, 1) f32; gate, up (E, D, F); down (E, F, D) -> (T, D) f32."""
    t, d = x.shape
    n_exp, _, f = gate.shape
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    return pl.pallas_call(
        moe_kernel,
        grid=(t // bt, n_exp, f // bf),
        in_specs=[
            pl.BlockSpec((bt, d), lambda i, e, j: (i, 0)),
            pl.BlockSpec((None, bt, 1), lambda i, e, j: (e, i, 0)),
            pl.BlockSpec((None, d, bf), lambda i, e, j: (e, 0, j), **pipeline),
            pl.BlockSpec((None, d, bf), lambda i, e, j: (e, 0, j), **pipeline),
            pl.BlockSpec((None, bf, d), lambda i, e, j: (e, j, 0), **pipeline),
        ],
        out_specs=pl.BlockSpec((bt, d), lambda i, e, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((t, d), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bt, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT,
        ),
    )(x, weights, gate, up, down)


def route(x, router, k):
    """Per-token expert weights (tokens, experts), f32: softmax over the top-k logits."""
    logits = x @ router
    top_vals, top_idx = jax.lax.top_k(logits, k)
    probs = jax.nn.softmax(top_vals, axis=-1)
    one_hot = jax.nn.one_hot(top_idx, router.shape[-1], dtype=jnp.float32)
    return jnp.sum(one_hot * probs[..., None], axis=-2)


def workload(x, router, gate, up, down):
    s = SCHEDULE
    b, sq, d = x.shape
    weights = route(x, router, int(CONFIG["num_experts_per_tok"])).reshape(b * sq, -1)  # (T, E) f32
    out = moe_experts(x.reshape(b * sq, d), weights.T[:, :, None], gate, up, down, bt=s["block_tokens"], bf=s["block_mlp"],
                      buffers=s["buffers"])
    return out.reshape(b, sq, d)
