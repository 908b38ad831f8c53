"""Causal grouped-query attention (splash-style, pre-scaled q) as a Pallas TPU flash kernel.

q (B, Hq, S, D) and k, v (B, Hkv, S, D) in BHSD; query head h reads KV head h // (Hq/Hkv).
A grid step takes ``heads_per_step`` consecutive query heads of one KV group as a
(heads, block_q, D) block, so each k/v block is fetched once for all of them. Grid
(batch, kv heads, head groups, q blocks, kv blocks); each step folds one kv block into
every head's running max m, row sum l and f32 accumulator (online softmax), skipping kv
blocks wholly above the causal diagonal. Scores are not scaled: the inputs are.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "heads_per_step": 4, "buffers": 2, "kv_index_map": "plain"}

MASK_VALUE = -1e30  # what the reference writes over scores of keys after the query


def sparse_attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
    heads, block_q, _ = q_ref.shape
    block_k = k_ref.shape[0]
    qi, kj = pl.program_id(3), pl.program_id(4)

    @pl.when(kj == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(kj * block_k <= (qi + 1) * block_q - 1)  # some key is not after the last query
    def _compute():
        k, v = k_ref[...], v_ref[...]
        rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = kj * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        causal = cols <= rows
        for h in range(heads):  # the group's heads reuse the k/v tiles already in VMEM
            s = jax.lax.dot_general(q_ref[h], k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            s = jnp.where(causal, s, MASK_VALUE)
            m_prev = m_ref[h]  # (block_q, 128): every lane holds the row's value
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, :1])
            m_ref[h] = m_next
            l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)
            pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc_ref[h] = alpha[:, :1] * acc_ref[h] + pv

    @pl.when(kj == pl.num_programs(4) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, :, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "heads_per_step", "buffers", "kv_index_map"))
def sparse_attention(q, k, v, *, bq, bk, heads_per_step, buffers, kv_index_map):
    batch, q_heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    g = heads_per_step
    steps_per_group = q_heads // kv_heads // g
    grid = (batch, kv_heads, steps_per_group, seq // bq, seq // bk)

    def q_map(b, kvh, hg, i, j):
        return (b, kvh * steps_per_group + hg, i, 0)

    def kv_map(b, kvh, hg, i, j):
        needed = j * bk <= (i + 1) * bq - 1
        if kv_index_map == "clamp":  # skipped steps keep the last needed block: no new DMA
            j = jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        elif kv_index_map == "next_row":  # skipped steps fetch block 0, which the next q block starts with
            j = jnp.where(needed, j, 0)
        return (b, kvh, j, 0)

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    return pl.pallas_call(
        sparse_attention_kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((sq, g, bq, head_dim), q_map),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((sq, g, bq, head_dim), q_map),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((g, bq, 128), jnp.float32),  # m: running row max per head
            pltpu.VMEM((g, bq, 128), jnp.float32),  # l: running row sum of exp per head
            pltpu.VMEM((g, bq, head_dim), jnp.float32),  # acc: unnormalised output per head
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "parallel", "arbitrary")
        ),
    )(q, k, v)


def workload(q, k, v):
    s = SCHEDULE
    return sparse_attention(
        q, k, v, bq=s["block_q"], bk=s["block_k"], heads_per_step=s["heads_per_step"],
        buffers=s["buffers"], kv_index_map=s["kv_index_map"],
    )
