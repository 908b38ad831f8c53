"""GQA decode attention over a paged KV cache as a Pallas TPU kernel.

Grid (sequence, page block). kv_lens, page_indices and cu_q_lens are scalar-prefetched
into SMEM: cu_q_lens picks each sequence's query row in the q BlockSpec's index map,
page_indices drives the DMAs that gather a block of pages from HBM, and kv_lens decides
which page blocks are needed at all. The pages of a block are scattered in HBM, so no
BlockSpec can fetch them: the kernel copies them one page (all KV heads: HBM tiles the
(kv head, head_dim) plane, so one head alone is not an addressable slice) per DMA into a
VMEM buffer. With ``buffers=2`` each step starts the copies for the next needed step
before waiting for its own.

Each needed step scores every query head against its KV head's keys in the block (a
strided VMEM load picks one KV head) in f32, masks positions at or past kv_len, and folds
them into a running max / sum / accumulator (online softmax); the sequence's last needed
block writes the normalised output.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"pages_per_block": 32, "buffers": 2}

MASK_VALUE = -1e30  # the reference's score for key positions at or past kv_len


def paged_attention_kernel(
    # scalar prefetch (SMEM)
    kv_lens_ref, page_indices_ref, cu_q_lens_ref,
    # inputs
    q_ref, k_hbm, v_hbm,
    # output
    o_ref,
    # scratch
    k_buf, v_buf, sems, slot_ref, m_ref, l_ref, acc_ref,
    *, sm_scale, buffers,
):
    s, b = pl.program_id(0), pl.program_id(1)
    num_seqs = pl.num_programs(0)
    _, block_len, num_kv_heads, _ = k_buf.shape
    page_size = k_hbm.shape[1]
    pages_per_block = block_len // page_size
    q_per_kv = q_ref.shape[0] // num_kv_heads
    kv_len = kv_lens_ref[s]

    def start(seq, blk, slot):
        """Start the DMAs of one step's pages, k and v, one page each."""
        def body(p, carry):
            page = page_indices_ref[seq, blk * pages_per_block + p]
            rows = pl.ds(pl.multiple_of(p * page_size, page_size), page_size)
            for hbm, buf in ((k_hbm, k_buf), (v_hbm, v_buf)):
                pltpu.make_async_copy(hbm.at[page], buf.at[slot, rows], sems.at[slot]).start()
            return carry

        jax.lax.fori_loop(0, pages_per_block, body, 0)

    def wait(slot):
        # A DMA semaphore counts bytes: one wait the size of a whole buffer covers its pages.
        for buf in (k_buf, v_buf):
            pltpu.make_async_copy(buf.at[slot], buf.at[slot], sems.at[slot]).wait()

    needed = b * block_len < kv_len
    last = (b + 1) * block_len >= kv_len  # the sequence's last needed block

    @pl.when(needed)
    def _step():
        if buffers == 1:
            slot = 0
            start(s, b, slot)
        else:
            @pl.when((s == 0) & (b == 0))
            def _first():
                slot_ref[0] = 0
                start(s, b, 0)

            slot = slot_ref[0]

            # The next needed step: this sequence's next block, else the next sequence's
            # block 0 (always needed: kv_len >= 1).
            @pl.when(jnp.logical_not(last) | (s + 1 < num_seqs))
            def _prefetch():
                start(jnp.where(last, s + 1, s), jnp.where(last, 0, b + 1), 1 - slot)

            slot_ref[0] = 1 - slot

        @pl.when(b == 0)
        def _init():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        wait(slot)
        pos = b * block_len + jax.lax.broadcasted_iota(jnp.int32, (q_per_kv, block_len), 1)
        for h in range(num_kv_heads):
            rows = pl.ds(h * q_per_kv, q_per_kv)
            q = q_ref[rows, :]
            k = k_buf[slot, :, h, :]  # (block_len, head_dim)
            scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            scores = jnp.where(pos < kv_len, scores * sm_scale, MASK_VALUE)
            m_prev = m_ref[rows, :]  # (q_per_kv, 128): every lane holds the row's value
            m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(scores - m_next[:, :1])
            m_ref[rows, :] = m_next
            l_ref[rows, :] = alpha * l_ref[rows, :] + jnp.sum(p, axis=1, keepdims=True)
            v = v_buf[slot, :, h, :]
            pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc_ref[rows, :] = alpha[:, :1] * acc_ref[rows, :] + pv

        @pl.when(last)
        def _store():
            o_ref[...] = (acc_ref[...] / l_ref[...][:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("pages_per_block", "buffers"))
def paged_attention(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, *, pages_per_block, buffers):
    num_seqs, pages_per_seq = page_indices.shape
    _, num_q_heads, head_dim = queries.shape
    _, page_size, num_kv_heads, _ = k_pages.shape
    block_len = pages_per_block * page_size
    grid = (num_seqs, pages_per_seq // pages_per_block)

    def q_map(s, b, kv_lens_ref, page_indices_ref, cu_q_lens_ref):
        return (cu_q_lens_ref[s], 0, 0)  # the sequence's query token

    def o_map(s, b, *_):
        return (s, 0, 0)

    kernel = functools.partial(paged_attention_kernel, sm_scale=head_dim**-0.5, buffers=buffers)
    buf = pltpu.VMEM((buffers, block_len, num_kv_heads, head_dim), k_pages.dtype)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=grid,
            in_specs=[
                pl.BlockSpec((None, num_q_heads, head_dim), q_map),
                pl.BlockSpec(memory_space=pl.ANY),  # k pages stay in HBM: gathered by DMA
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=pl.BlockSpec((None, num_q_heads, head_dim), o_map),
            scratch_shapes=[
                buf, buf,  # k, v pages of `buffers` steps
                pltpu.SemaphoreType.DMA((buffers,)),
                pltpu.SMEM((1,), jnp.int32),  # which buffer holds the current step's pages
                pltpu.VMEM((num_q_heads, 128), jnp.float32),  # m: running row max
                pltpu.VMEM((num_q_heads, 128), jnp.float32),  # l: running row sum of exp
                pltpu.VMEM((num_q_heads, head_dim), jnp.float32),  # acc: unnormalised output
            ],
        ),
        out_shape=jax.ShapeDtypeStruct((num_seqs, num_q_heads, head_dim), queries.dtype),
        # Sequential: with buffers=2 a step starts the copies the next step waits for.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary")),
    )(kv_lens, page_indices, cu_q_lens, queries, k_pages, v_pages)


def workload(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
    s = SCHEDULE
    return paged_attention(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                           pages_per_block=s["pages_per_block"], buffers=s["buffers"])
