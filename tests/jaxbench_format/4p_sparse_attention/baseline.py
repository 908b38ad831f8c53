"""4p sparse_attention: mirrors JAXBench's formulation of 4p (Llama-3.1-70B splash-style causal GQA).

Per batch element (a vmap over the batch): the KV heads are repeated so each serves its
consecutive group of query heads, scores are q·kᵀ with no scale (q arrives pre-scaled by
head_dim^-0.5 from the input generator), future keys get -1e30 through a boolean
lower-triangular mask, then a softmax over keys and the weighted values.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_70b_sparse_attention",
    "model": "Llama-3.1-70B",
    "operator": "sparse_attention",
    "batch": 4,
    "seq_len": 4096,
    "num_query_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
}


def create_inputs(dtype=jnp.bfloat16):
    k_q, k_k, k_v = jax.random.split(jax.random.key(42), 3)
    rows, length, width = CONFIG["batch"], CONFIG["seq_len"], CONFIG["head_dim"]
    kv_shape = (rows, CONFIG["num_kv_heads"], length, width)
    q = jax.random.normal(k_q, (rows, CONFIG["num_query_heads"], length, width), dtype=dtype) * (width**-0.5)
    k = jax.random.normal(k_k, kv_shape, dtype=dtype) * 0.02
    v = jax.random.normal(k_v, kv_shape, dtype=dtype) * 0.02
    return q, k, v


def workload(q, k, v):
    length = CONFIG["seq_len"]
    group = CONFIG["num_query_heads"] // CONFIG["num_kv_heads"]

    def one_example(q_ex, k_ex, v_ex):  # (H, S, D) slices of one batch element
        k_wide = jnp.repeat(k_ex, group, axis=0)
        v_wide = jnp.repeat(v_ex, group, axis=0)
        logits = jnp.einsum("hqd,hkd->hqk", q_ex, k_wide)
        lower = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
        logits = jnp.where(lower[None, :, :], logits, -1e30)
        weights = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("hqk,hkd->hqd", weights, v_wide)

    return jax.vmap(one_example)(q, k, v)
