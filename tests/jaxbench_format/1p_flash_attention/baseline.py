"""1p flash_attention: mirrors JAXBench's formulation of 1p (plain causal multi-head attention).

Scores q·kᵀ scaled by head_dim^-0.5, a lower-triangular mask that puts -1e9 on future
keys, a softmax over keys and the weighted sum of values, all on BHSD tensors in the
input dtype. No grouping, soft-cap or window.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "flash_attention_baseline",
    "model": "Baseline-MHA",
    "operator": "causal_mha",
    "batch": 4,
    "seq_len": 4096,
    "num_heads": 64,
    "head_dim": 128,
}


def create_inputs(dtype=jnp.bfloat16):
    shape = (CONFIG["batch"], CONFIG["num_heads"], CONFIG["seq_len"], CONFIG["head_dim"])
    keys = jax.random.split(jax.random.PRNGKey(42), 3)
    return tuple(jax.random.normal(k, shape, dtype=dtype) for k in keys)


def workload(query, key, value):
    _, _, length, width = query.shape
    logits = jnp.einsum("bhqd,bhkd->bhqk", query, key) * width**-0.5
    allowed = jnp.tril(jnp.ones((length, length)))
    logits = jnp.where(allowed, logits, -1e9)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, value)
