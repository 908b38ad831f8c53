"""15p retnet_retention: mirrors JAXBench's formulation of 15p (RetNet-6.7B multi-scale retention).

Parallel form of retention: head h decays with gamma_h = 1 - 2^(-5-h); the (head, i, j)
decay exp(log(gamma_h) * (i - j)) is zeroed above the diagonal by a causal mask; the f32
scores q.k (no 1/sqrt(d)) are multiplied by it, each row divided by max(sum |row|, 1),
cast to the input dtype and multiplied by v.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "retnet_6_7b_retention",
    "model": "RetNet-6.7B",
    "operator": "multi_scale_retention",
    "batch": 4,
    "seq_len": 4096,
    "num_heads": 16,
    "head_dim": 256,
    "d_model": 4096,
}


def create_inputs(dtype=jnp.bfloat16):
    shape = (CONFIG["batch"], CONFIG["num_heads"], CONFIG["seq_len"], CONFIG["head_dim"])
    return tuple(jax.random.normal(k, shape, dtype=dtype) for k in jax.random.split(jax.random.PRNGKey(42), 3))


def workload(query, key, value):
    n_heads, length = query.shape[1], query.shape[2]

    # one decay rate per head, from fast (head 0) to very slow
    rates = 1.0 - jnp.exp2(-5.0 - jnp.arange(n_heads, dtype=jnp.float32))

    # (head, i, j) decay rates^(i - j), kept only where j <= i
    pos = jnp.arange(length, dtype=jnp.float32)
    lag = pos[:, None] - pos[None, :]
    lower = (lag >= 0).astype(jnp.float32)
    log_rates = jnp.log(rates)
    decay = jnp.exp(log_rates[:, None, None] * lag[None, :, :])
    decay = decay * lower[None, :, :]

    scores = jnp.einsum("bhqd,bhkd->bhqk", query.astype(jnp.float32), key.astype(jnp.float32))
    scores = scores * decay[None, :, :, :]

    # each query row scaled by its total absolute weight, at least 1
    row_total = jnp.sum(jnp.abs(scores), axis=-1, keepdims=True)
    row_total = jnp.maximum(row_total, 1.0)
    scores = scores / row_total

    return jnp.einsum("bhqk,bhkd->bhqd", scores.astype(query.dtype), value)
