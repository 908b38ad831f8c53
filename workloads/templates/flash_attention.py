"""Causal multi-head attention as a Pallas TPU flash kernel: online softmax over KV blocks.

Grid (batch, heads, q blocks, kv blocks). Each step scores one (block_q, block_k) tile of
q·kᵀ in f32, folds it into running row max m, row sum l and output accumulator acc (f32
VMEM scratch), and the last kv step writes acc / l. KV blocks wholly above the causal
diagonal are skipped with pl.when; ``kv_index_map`` decides what the k/v pipeline fetches
on those skipped steps. A kv block can be computed in ``kv_splits`` sub-blocks, which
keeps the f32 score tile small while the DMA stays large. ``mask`` decides which computed
blocks build the causal mask: all of them, or only those crossing the diagonal; ``scale``
whether 1/sqrt(head_dim) multiplies each f32 score tile or, once per step, q (rounded to
its dtype: the reference rounds its bf16 scores too).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "kv_splits": 1, "buffers": 2, "kv_index_map": "plain",
            "mask": "every_block", "scale": "scores"}

MASK_VALUE = -1e9  # what the reference writes over scores of keys after the query


def attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, sm_scale, kv_splits, mask, scale):
    block_q, head_dim = q_ref.shape
    block_k = k_ref.shape[0]
    sub = block_k // kv_splits
    qi, kj = pl.program_id(2), pl.program_id(3)
    last_row = (qi + 1) * block_q - 1  # the block's last query position

    @pl.when(kj == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def compute(c, masked=True):
        first_col = kj * block_k + c * sub  # first key position of this sub-block
        k = k_ref[pl.ds(c * sub, sub), :]
        v = v_ref[pl.ds(c * sub, sub), :]
        q = q_ref[...]
        if scale == "queries":  # a (block_q, head_dim) multiply instead of a (block_q, sub) one
            q = (q.astype(jnp.float32) * sm_scale).astype(q_ref.dtype)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        if scale == "scores":
            s = s * sm_scale
        if masked:
            rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = first_col + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(cols <= rows, s, MASK_VALUE)

        m_prev = m_ref[...]  # (block_q, 128): every lane holds the row's value
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        m_ref[...] = m_next
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        acc_ref[...] = alpha[:, :1] * acc_ref[...] + pv

    # Sub-block c has work for this q block when its first key is not after the last query;
    # with mask="diagonal" only sub-blocks crossing the diagonal build the causal mask.
    for c in range(kv_splits):
        first_col, last_col = kj * block_k + c * sub, kj * block_k + (c + 1) * sub - 1
        if mask == "every_block":
            pl.when(first_col <= last_row)(functools.partial(compute, c))
        else:
            below = last_col <= qi * block_q  # every key at or before the block's first query
            pl.when(below)(functools.partial(compute, c, masked=False))
            pl.when(jnp.logical_and(first_col <= last_row, jnp.logical_not(below)))(functools.partial(compute, c))

    @pl.when(kj == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "kv_splits", "buffers", "kv_index_map", "mask", "scale"))
def flash_attention(q, k, v, *, bq, bk, kv_splits, buffers, kv_index_map, mask="every_block", scale="scores"):
    batch, heads, seq, head_dim = q.shape
    grid = (batch, heads, seq // bq, seq // bk)

    def q_map(b, h, i, j):
        return (b, h, i, 0)

    def kv_map(b, h, i, j):
        needed = j * bk <= (i + 1) * bq - 1
        if kv_index_map == "clamp":  # skipped steps keep the last needed block: no new DMA
            j = jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        elif kv_index_map == "next_row":  # skipped steps fetch block 0, which the next q block starts with
            j = jnp.where(needed, j, 0)
        return (b, h, j, 0)

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    kernel = functools.partial(attention_kernel, sm_scale=head_dim**-0.5, kv_splits=kv_splits, mask=mask,
                               scale=scale)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((sq, sq, bq, head_dim), q_map),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((sq, sq, bq, head_dim), q_map),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((bq, 128), jnp.float32),  # m: running row max
            pltpu.VMEM((bq, 128), jnp.float32),  # l: running row sum of exp
            pltpu.VMEM((bq, head_dim), jnp.float32),  # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )(q, k, v)


def workload(q, k, v):
    s = SCHEDULE
    return flash_attention(
        q, k, v, bq=s["block_q"], bk=s["block_k"], kv_splits=s["kv_splits"],
        buffers=s["buffers"], kv_index_map=s["kv_index_map"], mask=s["mask"],
        scale=s["scale"],
    )
