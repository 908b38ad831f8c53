"""6p paged_attention, optimized: mirrors JAXBench's expert file for 6p.

Calls jax's shipped Pallas TPU paged attention kernel
(``jax.experimental.pallas.ops.tpu.paged_attention``) in its own calling convention, which
is JAXBench's signature here: one query row per sequence, K and V pages head-major
(num_kv_heads, total_pages, page_size, head_dim), and JAXBench's tuning of 128 pages per
compute block; every other kernel argument is left at its default.
"""
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

CONFIG = {
    "name": "pallas_paged_attention_llama70b",
    "model": "Llama-3.1-70B",
    "operator": "pallas_paged_attention",
    "batch": 64,
    "num_q_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "page_size": 16,
    "pages_per_seq": 256,
    "atol": 1e-2,
    "rtol": 2e-2,
}

TUNED_PARAMS = {"pages_per_compute_block": 128}


def create_inputs(dtype=jnp.bfloat16):
    seqs, q_heads, kv_heads = CONFIG["batch"], CONFIG["num_q_heads"], CONFIG["num_kv_heads"]
    dim, page, per_seq = CONFIG["head_dim"], CONFIG["page_size"], CONFIG["pages_per_seq"]
    n_pages = seqs * per_seq
    key_q, key_k, key_v = jax.random.split(jax.random.PRNGKey(42), 3)
    q = jax.random.normal(key_q, (seqs, q_heads, dim), dtype=dtype)
    k_pages = jax.random.normal(key_k, (kv_heads, n_pages, page, dim), dtype=dtype)
    v_pages = jax.random.normal(key_v, (kv_heads, n_pages, page, dim), dtype=dtype)
    lengths = jnp.full((seqs,), per_seq * page, dtype=jnp.int32)
    page_indices = jnp.arange(n_pages, dtype=jnp.int32).reshape(seqs, per_seq)
    return q, k_pages, v_pages, lengths, page_indices


def workload(q, k_pages, v_pages, lengths, page_indices):
    with jax.named_scope("bench_kernel"):
        return paged_attention(q, k_pages, v_pages, lengths, page_indices,
                               pages_per_compute_block=TUNED_PARAMS["pages_per_compute_block"])
