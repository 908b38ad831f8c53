"""Ragged paged attention (mixed prefill and decode) as a Pallas TPU kernel.

Grid (query block,): each step owns q_block consecutive query tokens, which may belong
to several sequences. kv_lens, page_indices, cu_q_lens, num_seqs and, per query block,
the first and last sequence it overlaps (found with a searchsorted on cu_q_lens outside
the kernel) are scalar-prefetched into SMEM and drive the walk: the step loops over those
sequences and, for each, over the kv blocks its rows in this query block can see
(causally: blocks past the last row's position are skipped). Each kv block's pages are
scattered in HBM, so the kernel copies them one page (all combined K/V heads) per DMA
into a VMEM buffer, only the pages holding visible keys; with ``buffers=2`` the next kv
block's copies start before this one is computed.

Per KV head h, K is combined head 2h and V is 2h + 1. With ``kv_load="strided"`` each is
one strided VMEM load of bf16 rows; bf16 rows 2h and 2h + 1 share one 32-bit word per
lane, so with ``kv_load="words"`` the pages are copied as uint32 words (a bitcast of the
HBM pages, no copy) and one strided load of word row h gives both: K in the low halves,
V in the high halves, each an exact f32 once shifted into the high bits. Its query
heads' rows are scored in f32 with a mask bias added (0, or the reference's mask value
where the row is not in the sequence or the key is after the row's position), and the
block's softmax, taken against its own row max, is folded into a running max / sum /
accumulator per row (online softmax). A row that has not yet seen a key of its own
sequence may gather masked keys' weights, which its first own key wipes (its running max
rises from the mask value: alpha = 0); rows no sequence owns are written as zeros. Keys
past a block's copied pages are masked like any other, so the page buffers are zeroed at
each step's start (no copy is in flight then): what those rows hold is finite.

A sequence's rows are scored in one pass over the whole block, or, with ``q_splits`` > 1,
when they lie within one pass of q_block / q_splits tokens (a decode's one row), in that
pass alone: a query block of decodes then costs one small pass per decode and kv block
rather than the whole block's rows each time.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"q_block": 32, "pages_per_block": 32, "buffers": 2, "kv_load": "strided", "q_splits": 1}

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # the reference's value for masked scores


def ragged_paged_attention_kernel(
    # scalar prefetch (SMEM)
    kv_lens_ref, page_indices_ref, cu_q_lens_ref, num_seqs_ref, first_seq_ref, last_seq_ref,
    # inputs
    q_ref, kv_hbm,
    # output
    o_ref,
    # scratch
    kv_buf, sems, m_ref, l_ref, acc_ref,
    *, sm_scale, buffers, words, page_size, num_kv_heads, q_splits,
):
    i = pl.program_id(0)
    q_block, num_q_heads, head_dim = q_ref.shape
    # words: each page is (page_size * num_kv_heads, head_dim) uint32 rows (token, KV head)
    block_len = kv_buf.shape[1] // num_kv_heads if words else kv_buf.shape[1]
    page_rows = page_size * num_kv_heads if words else page_size
    src = kv_hbm.bitcast(jnp.uint32) if words else kv_hbm
    q_per_kv = num_q_heads // num_kv_heads
    pages_per_block = block_len // page_size
    q_pass = q_block // q_splits  # tokens of a pass over one sequence's rows
    block_start = i * q_block
    first, last = first_seq_ref[i], last_seq_ref[i]
    del num_seqs_ref  # first/last already stop at the last active sequence

    # Rows past a block's copied pages are read as masked keys: zeros or an earlier block's
    # pages, never uninitialised VMEM (a NaN there would survive the mask bias and p @ v).
    kv_buf[...] = jnp.zeros_like(kv_buf)
    m_ref[...] = jnp.full_like(m_ref, MASK_VALUE)
    l_ref[...] = jnp.zeros_like(l_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)

    def lanes(x):  # (rows, 128) -> (rows, head_dim), lanes repeated
        return x if head_dim == 128 else jnp.tile(x, (1, head_dim // 128))

    def visible_len(s):
        # Keys past the last position of s's rows in this block are masked for all of them.
        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]
        last_row = jnp.minimum(q_end, block_start + q_block) - 1
        return kv_lens_ref[s] - (q_end - q_start) + (last_row - q_start) + 1

    def num_kv_blocks(s):
        return jnp.maximum(1, (visible_len(s) + block_len - 1) // block_len)

    def num_pages(s, j):
        """Pages of kv block j that hold visible keys (the rest are neither copied nor read)."""
        return jnp.clip((visible_len(s) - j * block_len + page_size - 1) // page_size, 0, pages_per_block)

    def start(s, j, slot):
        def body(p, carry):
            page = page_indices_ref[s, j * pages_per_block + p]
            rows = pl.ds(pl.multiple_of(p * page_rows, page_size), page_rows)
            pltpu.make_async_copy(src.at[page], kv_buf.at[slot, rows], sems.at[slot]).start()
            return carry

        jax.lax.fori_loop(0, num_pages(s, j), body, 0)

    def wait(s, j, slot):
        def body(p, carry):
            # Every copy moved one page: any page-sized descriptor waits for one of them.
            pltpu.make_async_copy(src.at[0], kv_buf.at[slot, pl.ds(0, page_rows)], sems.at[slot]).wait()
            return carry

        jax.lax.fori_loop(0, num_pages(s, j), body, 0)

    def compute(s, j, slot):
        q_start, q_end, kv_len = cu_q_lens_ref[s], cu_q_lens_ref[s + 1], kv_lens_ref[s]
        key = j * block_len + jax.lax.broadcasted_iota(jnp.int32, (1, block_len), 1)

        def one_pass(c, size):
            """Score the rows of tokens [c * size, (c + 1) * size) of the block."""
            t0 = pl.multiple_of(c * size, size)
            rows = pl.ds(pl.multiple_of(t0 * q_per_kv, size * q_per_kv), size * q_per_kv)
            token = block_start + t0 + jax.lax.broadcasted_iota(jnp.int32, (size * q_per_kv, 1), 0) // q_per_kv
            # Each row's last visible key (its causal position in s); -1 for other sequences' rows.
            last_key = jnp.where((token >= q_start) & (token < q_end), kv_len - q_end + token, -1)
            bias = jnp.where(key <= last_key, 0.0, MASK_VALUE)
            q_all = q_ref[pl.ds(t0, size)].astype(jnp.float32)  # f32 keeps the head slices tile-aligned
            for h in range(num_kv_heads):
                heads = pl.ds(h * q_per_kv, q_per_kv)
                # (size, q_per_kv, head_dim) -> rows ordered (token, head)
                q = q_all[:, h * q_per_kv:(h + 1) * q_per_kv, :].reshape(-1, head_dim).astype(kv_hbm.dtype)
                if words:
                    pair = kv_buf[slot, pl.ds(h, block_len, stride=num_kv_heads), :]
                    k = jax.lax.bitcast_convert_type(pair << 16, jnp.float32).astype(q.dtype)
                    v = jax.lax.bitcast_convert_type(pair & jnp.uint32(0xFFFF0000), jnp.float32).astype(q.dtype)
                else:
                    k, v = kv_buf[slot, :, 2 * h, :], kv_buf[slot, :, 2 * h + 1, :]
                scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
                scores = scores * sm_scale + bias
                # The block's softmax against its own row max, rescaled by beta into the running one
                m_cur = jnp.max(scores, axis=1, keepdims=True)
                p = jnp.exp(scores - m_cur)
                pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
                m_prev = m_ref[h, rows, :]  # (rows, 128): every lane holds the row's value
                m_next = jnp.maximum(m_prev, m_cur)
                alpha, beta = jnp.exp(m_prev - m_next), jnp.exp(m_cur - m_next)
                m_ref[h, rows, :] = m_next
                l_ref[h, rows, :] = alpha * l_ref[h, rows, :] + beta * jnp.sum(p, axis=1, keepdims=True)
                acc = acc_ref[pl.ds(t0, size), heads, :].reshape(-1, head_dim)
                acc = lanes(alpha) * acc + lanes(beta) * pv
                acc_ref[pl.ds(t0, size), heads, :] = acc.reshape(size, q_per_kv, head_dim)

        if q_pass == q_block:
            one_pass(0, q_block)
        else:  # s's rows within one pass (a decode's row) are scored alone, others with the block
            first_pass = jnp.maximum(q_start - block_start, 0) // q_pass
            within = first_pass == (jnp.minimum(q_end - block_start, q_block) - 1) // q_pass
            jax.lax.cond(within, lambda: one_pass(first_pass, q_pass), lambda: one_pass(0, q_block))

    # Walk the (sequence, kv block) pairs of this query block in order.
    def next_item(s, j):
        more = j + 1 < num_kv_blocks(s)
        return jnp.where(more, s, s + 1), jnp.where(more, j + 1, 0)

    if buffers == 2:
        @pl.when(first <= last)
        def _first_fetch():
            start(first, 0, 0)

    def body(carry):
        s, j, slot = carry
        ns, nj = next_item(s, j)
        if buffers == 2:
            @pl.when(ns <= last)
            def _prefetch():
                start(ns, nj, 1 - slot)
        else:
            start(s, j, slot)
        wait(s, j, slot)
        compute(s, j, slot)
        return ns, nj, (1 - slot) if buffers == 2 else slot

    jax.lax.while_loop(lambda c: c[0] <= last, body, (first, jnp.int32(0), jnp.int32(0)))

    # Rows no sequence owns (past the last one's tokens) end as zeros.
    token = block_start + jax.lax.broadcasted_iota(jnp.int32, (q_block * q_per_kv, 1), 0) // q_per_kv
    owned = token < cu_q_lens_ref[last + 1]
    for h in range(num_kv_heads):
        heads = pl.ds(h * q_per_kv, q_per_kv)
        out = jnp.where(owned, acc_ref[:, heads, :].reshape(-1, head_dim) / lanes(l_ref[h]), 0.0)
        acc_ref[:, heads, :] = out.reshape(q_block, q_per_kv, head_dim)
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("q_block", "pages_per_block", "buffers", "kv_load", "q_splits"))
def ragged_paged_attention(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                           q_block, pages_per_block, buffers, kv_load="strided", q_splits=1):
    num_tokens, num_q_heads, head_dim = queries.shape
    _, page_size, num_combined, _ = kv_pages.shape
    max_num_seqs = page_indices.shape[0]
    q_per_kv = num_q_heads // (num_combined // 2)
    block_len = pages_per_block * page_size
    num_q_blocks = num_tokens // q_block

    # The sequences each query block overlaps: [first, last], empty (first > last) past the
    # last active token. Inactive slots end at +inf so no block maps to them.
    ends = jnp.where(jnp.arange(max_num_seqs) < num_seqs[0], cu_q_lens[1:], jnp.iinfo(jnp.int32).max)
    block_starts = jnp.arange(num_q_blocks, dtype=jnp.int32) * q_block
    first = jnp.searchsorted(ends, block_starts, side="right").astype(jnp.int32)
    last_token = jnp.minimum(block_starts + q_block, cu_q_lens[num_seqs[0]]) - 1
    last = jnp.where(last_token >= block_starts, jnp.searchsorted(ends, last_token, side="right"), -1)
    last = last.astype(jnp.int32)

    q_spec = pl.BlockSpec((q_block, num_q_heads, head_dim), lambda i, *_: (i, 0, 0))
    words = kv_load == "words"
    kernel = functools.partial(ragged_paged_attention_kernel, sm_scale=head_dim**-0.5, buffers=buffers, words=words,
                               page_size=page_size, num_kv_heads=num_combined // 2, q_splits=q_splits)
    if words:  # (pages, page_size * num_combined, head_dim): each token's combined heads one bf16 tile, a bitcast
        kv_pages = kv_pages.reshape(kv_pages.shape[0], page_size * num_combined, head_dim)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(num_q_blocks,),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY)],  # pages stay in HBM: gathered by DMA
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((buffers, block_len * num_combined // 2, head_dim), jnp.uint32) if words
                else pltpu.VMEM((buffers, block_len, num_combined, head_dim), kv_pages.dtype),
                pltpu.SemaphoreType.DMA((buffers,)),
                pltpu.VMEM((num_combined // 2, q_block * q_per_kv, 128), jnp.float32),  # m per KV head
                pltpu.VMEM((num_combined // 2, q_block * q_per_kv, 128), jnp.float32),  # l per KV head
                pltpu.VMEM((q_block, num_q_heads, head_dim), jnp.float32),  # acc
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(queries.shape, queries.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(kv_lens, page_indices, cu_q_lens, num_seqs, first, last, queries, kv_pages)


def workload(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    s = SCHEDULE
    return ragged_paged_attention(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                                  q_block=s["q_block"], pages_per_block=s["pages_per_block"], buffers=s["buffers"],
                                  kv_load=s["kv_load"], q_splits=s["q_splits"])
