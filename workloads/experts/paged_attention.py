"""Expert for 6p paged_attention: jax's Pallas TPU paged attention with JAXBench's tuning.

Kernel: ``jax.experimental.pallas.ops.tpu.paged_attention.paged_attention`` with
``pages_per_compute_block=128`` (workloads.md section 4); every other argument is its
default (its own mask value, no soft cap, ``megacore_mode=None``, ``inline_seq_dim=True``).
Adapted, and counted in its time:

* the kernel wants head-major pages, (num_kv_heads, total_pages, page_size, head_dim):
  k_pages and v_pages are transposed from the workload's (total_pages, page_size,
  num_kv_heads, head_dim) on every call;
* it takes one query row per sequence and no cu_q_lens: the rows queries[cu_q_lens[i]]
  are gathered first (the identity for the spec's cu_q_lens = arange);
* it applies no softmax scale (it has no such argument), so q is multiplied by
  head_dim^-0.5 first. JAXBench's optimized file omits this and passed only because its
  N·0.02 pages made the softmax nearly flat (see the workload's input fix).

pages_per_compute_block must divide pages_per_seq: it is clamped to pages_per_seq (read
from CONFIG) only where pages_per_seq is smaller, as at the check size (32 pages).
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

PAGES_PER_COMPUTE_BLOCK = 128


def workload(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
    pages_per_block = min(PAGES_PER_COMPUTE_BLOCK, CONFIG["pages_per_seq"])  # noqa: F821 - set by the env
    q = queries[cu_q_lens[:-1]] * queries.shape[-1] ** -0.5
    k = jnp.transpose(k_pages, (2, 0, 1, 3))
    v = jnp.transpose(v_pages, (2, 0, 1, 3))
    return paged_attention(q, k, v, kv_lens, page_indices, pages_per_compute_block=pages_per_block)
