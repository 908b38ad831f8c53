"""5p flex_attention: mirrors JAXBench's formulation of 5p (Llama-3.1-70B attention with a score modifier).

The score modifier is a learned relative-position bias per head, shared by the batch:
scores q·kᵀ·head_dim^-0.5, plus the head's (S, S) bias, -1e30 on future keys through a
boolean lower-triangular mask, softmax over keys and the weighted values (BHSD).
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_70b_flex_attention",
    "model": "Llama-3.1-70B",
    "operator": "flex_attention",
    "batch": 4,
    "seq_len": 4096,
    "num_heads": 64,
    "head_dim": 128,
}


def create_inputs(dtype=jnp.bfloat16):
    k_q, k_k, k_v, k_bias = jax.random.split(jax.random.PRNGKey(42), 4)
    heads, length = CONFIG["num_heads"], CONFIG["seq_len"]
    shape = (CONFIG["batch"], heads, length, CONFIG["head_dim"])
    q = jax.random.normal(k_q, shape, dtype=dtype)
    k = jax.random.normal(k_k, shape, dtype=dtype) * 0.02
    v = jax.random.normal(k_v, shape, dtype=dtype) * 0.02
    rel_pos_bias = jax.random.normal(k_bias, (heads, length, length), dtype=dtype) * 0.01
    return q, k, v, rel_pos_bias


def workload(q, k, v, rel_pos_bias):
    length = CONFIG["seq_len"]
    scale = CONFIG["head_dim"] ** -0.5
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    logits = logits + rel_pos_bias[None, :, :, :]  # the score modifier
    lower = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    logits = jnp.where(lower[None, None, :, :], logits, -1e30)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, v)
