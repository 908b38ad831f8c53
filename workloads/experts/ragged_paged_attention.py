"""Expert for 7p ragged_paged_attention: jax's Pallas TPU ragged paged attention (RPA)
with JAXBench's tuning.

Kernel: ``jax.experimental.pallas.ops.tpu.ragged_paged_attention.ragged_paged_attention``
with ``sm_scale = 1/sqrt(head_dim)``, ``num_kv_pages_per_block=64``,
``num_queries_per_block=64``, ``vmem_limit_bytes=32 MiB`` (workloads.md section 4; JAXBench
notes these were inherited from an older scenario). Nothing else is adapted: jax 0.10.2's
signature takes the workload's six inputs in the same order, and kv_pages already has the
layout it expects, (total_pages, page_size, 2 * num_kv_heads, head_dim) with K and V
interleaved on the combined head axis. Its default mask value is the reference's
-0.7 * float32 max.

num_kv_pages_per_block must not exceed pages_per_seq: it is clamped to pages_per_seq
(read from CONFIG) only where that is smaller (the check size has 32 pages per sequence);
at the full size (256) it is 64 as tuned.

jax's TPU interpreter cannot run this kernel on a CPU (it reshapes and bitcasts refs), so
off-TPU the environment compile-checks this exact file for v6e instead of running it.
"""

from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

NUM_KV_PAGES_PER_BLOCK = 64
NUM_QUERIES_PER_BLOCK = 64
VMEM_LIMIT_BYTES = 32 * 1024 * 1024


def workload(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    pages_per_block = min(NUM_KV_PAGES_PER_BLOCK, CONFIG["pages_per_seq"])  # noqa: F821 - set by the env
    return ragged_paged_attention(
        queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
        sm_scale=queries.shape[-1] ** -0.5,
        num_kv_pages_per_block=pages_per_block,
        num_queries_per_block=NUM_QUERIES_PER_BLOCK,
        vmem_limit_bytes=VMEM_LIMIT_BYTES,
    )
