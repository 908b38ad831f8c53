"""7p ragged_paged_attention: mirrors JAXBench's formulation of 7p (Llama-3.1-70B mixed
prefill and decode over a shuffled paged KV cache).

JAXBench's single serving scenario: 48 one-token decodes, then seven 512-token prefill
chunks and a 464-token one (4096 tokens), 8 of the 64 sequence slots idle. The per-slot
query counts of that scenario are static capacities: each active slot gathers that many
query rows from its start in cu_q_lens, attends (f32 scores times head_dim^-0.5, causal and
length masks with -0.7 * float32 max, softmax, cast to the value dtype) over the K and V
heads interleaved in kv_pages, and scatter-adds the rows that belong to it into the output.
"""
import math

import jax
import jax.numpy as jnp

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.dtype("float32")).max)

CONFIG = {
    "name": "ragged_paged_attention_llama70b",
    "model": "Llama-3.1-70B",
    "operator": "ragged_paged_attention",
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 64,
    "num_q_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 128,
    "page_size": 16,
    "pages_per_seq": 256,
}

# The scenario's query tokens per active slot, and each slot's context length after them.
SLOT_Q_LENS = (1,) * 48 + (512,) * 7 + (464,)
SLOT_KV_LENS = tuple(257 + ((s * 73) % 240) * 16 for s in range(48)) + (
    1023, 1535, 2047, 2559, 3071, 3583, 4095, 4095)
ACTIVE_SLOTS = len(SLOT_Q_LENS)


def create_inputs(dtype=jnp.bfloat16):
    tokens, slots = CONFIG["max_num_batched_tokens"], CONFIG["max_num_seqs"]
    q_heads, kv_heads, dim = CONFIG["num_q_heads"], CONFIG["num_kv_heads"], CONFIG["head_dim"]
    page, per_seq = CONFIG["page_size"], CONFIG["pages_per_seq"]
    n_pages = slots * per_seq
    key_q, key_kv, key_table = jax.random.split(jax.random.key(42), 3)
    queries = jax.random.normal(key_q, (tokens, q_heads, dim), dtype=dtype)
    kv_pages = jax.random.normal(key_kv, (n_pages, page, 2 * kv_heads, dim), dtype=dtype)
    kv_lens = jnp.pad(jnp.array(SLOT_KV_LENS, dtype=jnp.int32), (0, slots - ACTIVE_SLOTS))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(jnp.array(SLOT_Q_LENS, jnp.int32))])
    cu_q_lens = jnp.pad(bounds, (0, slots + 1 - bounds.shape[0]), constant_values=bounds[-1])
    # every page used once, in a shuffled physical order
    page_indices = jax.random.permutation(key_table, n_pages, independent=True)
    page_indices = page_indices.astype(jnp.int32).reshape(slots, per_seq)
    num_seqs = jnp.array([ACTIVE_SLOTS], dtype=jnp.int32)
    return queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs


def workload(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    scale = 1.0 / math.sqrt(CONFIG["head_dim"])
    _, _, combined_heads, dim = kv_pages.shape
    kv_heads = combined_heads // 2
    group = queries.shape[1] // kv_heads
    last_row = CONFIG["max_num_batched_tokens"] - 1
    out = jnp.zeros_like(queries)

    for s, capacity in enumerate(SLOT_Q_LENS):
        start = cu_q_lens[s]
        q_len = cu_q_lens[s + 1] - start
        kv_len = kv_lens[s]
        table = page_indices[s]

        offsets = jnp.arange(capacity, dtype=jnp.int32)
        rows = jnp.minimum(start + offsets, last_row)
        q = queries[rows]
        k = kv_pages[table, :, 0::2, :].reshape(-1, kv_heads, dim)
        v = kv_pages[table, :, 1::2, :].reshape(-1, kv_heads, dim)
        k = jnp.repeat(k, group, axis=1)
        v = jnp.repeat(v, group, axis=1)

        scores = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=jnp.float32)
        scores *= scale
        q_pos = (kv_len - q_len) + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        k_pos = jax.lax.broadcasted_iota(jnp.int32, scores.shape, 2)
        hidden = (q_pos < k_pos) | (k_pos >= kv_len)
        scores = jnp.where(hidden, MASK_VALUE, scores)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        o = jnp.einsum("hqk,khd->qhd", probs, v).astype(queries.dtype)

        mine = (offsets < q_len)[:, None, None] & (s < num_seqs[0])
        out = out.at[rows].add(jnp.where(mine, o, 0.0))

    return out
