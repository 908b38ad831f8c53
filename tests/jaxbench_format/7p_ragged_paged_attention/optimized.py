"""7p ragged_paged_attention, optimized: mirrors JAXBench's expert file for 7p.

Calls jax's shipped Pallas TPU ragged paged attention kernel
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``) on the six inputs as they come
(K and V interleaved on the combined head axis of kv_pages), with a head_dim^-0.5 softmax
scale and JAXBench's tuning: 64 KV pages and 64 query tokens per block, 32 MiB of VMEM.
"""
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

CONFIG = {
    "name": "pallas_ragged_paged_attention_llama70b",
    "model": "Llama-3.1-70B",
    "operator": "pallas_ragged_paged_attention",
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 64,
    "num_q_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "page_size": 16,
    "pages_per_seq": 256,
    "atol": 0.2,
    "rtol": 0.2,
}

TUNED_PARAMS = {
    "num_kv_pages_per_block": 64,
    "num_queries_per_block": 64,
    "vmem_limit_bytes": 32 * 1024 * 1024,
}

# JAXBench's serving scenario: 48 decodes, seven 512-token prefill chunks and a 464-token one.
SLOT_Q_LENS = (1,) * 48 + (512,) * 7 + (464,)
SLOT_KV_LENS = tuple(257 + ((s * 73) % 240) * 16 for s in range(48)) + (
    1023, 1535, 2047, 2559, 3071, 3583, 4095, 4095)


def create_inputs(dtype=jnp.bfloat16):
    tokens, slots = CONFIG["max_num_batched_tokens"], CONFIG["max_num_seqs"]
    q_heads, kv_heads, dim = CONFIG["num_q_heads"], CONFIG["num_kv_heads"], CONFIG["head_dim"]
    page, per_seq = CONFIG["page_size"], CONFIG["pages_per_seq"]
    n_pages, active = slots * per_seq, len(SLOT_Q_LENS)
    key_q, key_kv, key_table = jax.random.split(jax.random.key(42), 3)
    queries = jax.random.normal(key_q, (tokens, q_heads, dim), dtype=dtype)
    kv_pages = jax.random.normal(key_kv, (n_pages, page, 2 * kv_heads, dim), dtype=dtype)
    kv_lens = jnp.pad(jnp.array(SLOT_KV_LENS, dtype=jnp.int32), (0, slots - active))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(jnp.array(SLOT_Q_LENS, jnp.int32))])
    cu_q_lens = jnp.pad(bounds, (0, slots + 1 - bounds.shape[0]), constant_values=bounds[-1])
    page_indices = jax.random.permutation(key_table, n_pages, independent=True)
    page_indices = page_indices.astype(jnp.int32).reshape(slots, per_seq)
    num_seqs = jnp.array([active], dtype=jnp.int32)
    return queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs


def workload(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    with jax.named_scope("bench_kernel"):
        return ragged_paged_attention(
            q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
            sm_scale=1.0 / math.sqrt(CONFIG["head_dim"]),
            num_kv_pages_per_block=TUNED_PARAMS["num_kv_pages_per_block"],
            num_queries_per_block=TUNED_PARAMS["num_queries_per_block"],
            vmem_limit_bytes=TUNED_PARAMS["vmem_limit_bytes"],
        )
