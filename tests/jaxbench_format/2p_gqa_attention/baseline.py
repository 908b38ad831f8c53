"""2p gqa_attention: mirrors JAXBench's formulation of 2p (Llama-3.1-405B grouped-query attention).

BSHD inputs; each KV head is copied to the consecutive group of query heads that shares
it (a new axis repeated, then folded into the head axis), everything is moved to BHSD,
and causal attention follows: scores scaled by head_dim^-0.5, -1e9 on future keys,
softmax, weighted values, and the result moved back to BSHD.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_405b_gqa",
    "model": "Llama-3.1-405B",
    "operator": "gqa_attention",
    "batch": 4,
    "seq_len": 4096,
    "num_query_heads": 128,
    "num_kv_heads": 8,
    "head_dim": 128,
    "emb_dim": 16384,
}


def create_inputs(dtype=jnp.bfloat16):
    k_q, k_k, k_v = jax.random.split(jax.random.PRNGKey(42), 3)
    rows, length, width = CONFIG["batch"], CONFIG["seq_len"], CONFIG["head_dim"]
    q_shape = (rows, length, CONFIG["num_query_heads"], width)
    kv_shape = (rows, length, CONFIG["num_kv_heads"], width)
    return (jax.random.normal(k_q, q_shape, dtype=dtype),
            jax.random.normal(k_k, kv_shape, dtype=dtype),
            jax.random.normal(k_v, kv_shape, dtype=dtype))


def workload(query, key, value):
    rows, length, q_heads, width = query.shape
    group = q_heads // key.shape[2]

    def widen(t):  # (B, S, Hkv, D) -> (B, S, Hq, D), KV head j serving query heads j*group..
        return jnp.repeat(t[:, :, :, None, :], group, axis=3).reshape(rows, length, q_heads, width)

    key, value = widen(key), widen(value)
    q_bhsd, k_bhsd, v_bhsd = (t.transpose(0, 2, 1, 3) for t in (query, key, value))
    logits = jnp.einsum("bhqd,bhkd->bhqk", q_bhsd, k_bhsd) * width**-0.5
    allowed = jnp.tril(jnp.ones((length, length)))
    logits = jnp.where(allowed, logits, -1e9)
    weights = jax.nn.softmax(logits, axis=-1)
    mixed = jnp.einsum("bhqk,bhkd->bhqd", weights, v_bhsd)
    return mixed.transpose(0, 2, 1, 3)
