"""6p paged_attention: mirrors JAXBench's formulation of 6p (Llama-3.1-70B decode over a paged KV cache).

One query token per sequence attends to that sequence's keys and values, gathered from its
pages in page-table order. Under ``vmap`` over sequences: the KV heads are repeated for the
grouped-query heads, scores are scaled by head_dim^-0.5, key positions at or past the
sequence's length get -1e30, and a softmax weights the values, all in the input dtype.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_70b_paged_attention",
    "model": "Llama-3.1-70B",
    "operator": "paged_attention",
    "num_seqs": 64,
    "max_seq_len": 4096,
    "num_query_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "page_size": 16,
    "pages_per_seq": 256,
}


def create_inputs(dtype=jnp.bfloat16):
    seqs, seq_len = CONFIG["num_seqs"], CONFIG["max_seq_len"]
    q_heads, kv_heads, dim = CONFIG["num_query_heads"], CONFIG["num_kv_heads"], CONFIG["head_dim"]
    page, per_seq = CONFIG["page_size"], CONFIG["pages_per_seq"]
    n_pages = seqs * per_seq
    keys = jax.random.split(jax.random.PRNGKey(42), 5)
    queries = jax.random.normal(keys[0], (seqs, q_heads, dim), dtype=dtype)  # one decode token each
    k_pages = 0.02 * jax.random.normal(keys[1], (n_pages, page, kv_heads, dim), dtype=dtype)
    v_pages = 0.02 * jax.random.normal(keys[2], (n_pages, page, kv_heads, dim), dtype=dtype)
    kv_lens = jnp.full((seqs,), seq_len, dtype=jnp.int32)
    page_indices = jnp.arange(n_pages, dtype=jnp.int32).reshape(seqs, per_seq)  # contiguous pages
    cu_q_lens = jnp.arange(seqs + 1, dtype=jnp.int32)
    return queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens


def workload(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
    seqs = CONFIG["num_seqs"]
    q_heads, kv_heads, dim = CONFIG["num_query_heads"], CONFIG["num_kv_heads"], CONFIG["head_dim"]
    keys_per_seq = CONFIG["pages_per_seq"] * CONFIG["page_size"]
    group = q_heads // kv_heads
    scale = dim**-0.5

    def decode_one(s):
        q = jax.lax.dynamic_slice(queries, (cu_q_lens[s], 0, 0), (1, q_heads, dim))
        table = page_indices[s]
        k = k_pages[table].reshape(keys_per_seq, kv_heads, dim)
        v = v_pages[table].reshape(keys_per_seq, kv_heads, dim)
        k = jnp.repeat(k, group, axis=1)
        v = jnp.repeat(v, group, axis=1)
        scores = jnp.einsum("qhd,khd->hqk", q, k) * scale
        visible = jnp.arange(keys_per_seq) < kv_lens[s]
        scores = jnp.where(visible[None, None, :], scores, -1e30)
        probs = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("hqk,khd->qhd", probs, v).squeeze(0)

    return jax.vmap(decode_one)(jnp.arange(seqs))
