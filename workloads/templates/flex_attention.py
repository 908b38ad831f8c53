"""Causal attention with an additive per-head score bias as a Pallas TPU flash kernel.

q, k, v (B, H, S, D) in BHSD and rel_pos_bias (H, S, S), shared across the batch. Grid
(batch blocks, heads, q blocks, kv blocks); each step streams the (block_q, block_k) bias
tile of its head next to the k/v blocks and folds s = q·kᵀ·D^-0.5 + bias into running max
m, row sum l and f32 accumulator (online softmax), skipping kv blocks wholly above the
causal diagonal. The bias is the largest input (H·S² values, more than q, k and v
together), so a step takes ``batch_per_step`` batch elements: each bias tile is then read
from HBM once for all of them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "batch_per_step": 1, "buffers": 2, "kv_index_map": "plain"}

MASK_VALUE = -1e30  # what the reference writes over scores of keys after the query


def flex_attention_kernel(q_ref, k_ref, v_ref, bias_ref, o_ref, m_ref, l_ref, acc_ref, *, sm_scale):
    batch, block_q, _ = q_ref.shape
    block_k = k_ref.shape[1]
    qi, kj = pl.program_id(2), pl.program_id(3)

    @pl.when(kj == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(kj * block_k <= (qi + 1) * block_q - 1)  # some key is not after the last query
    def _compute():
        rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        cols = kj * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        causal = cols <= rows
        bias = bias_ref[...].astype(jnp.float32)
        for b in range(batch):  # the batch elements share the bias tile already in VMEM
            s = jax.lax.dot_general(q_ref[b], k_ref[b], (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)
            s = jnp.where(causal, s * sm_scale + bias, MASK_VALUE)
            m_prev = m_ref[b]  # (block_q, 128): every lane holds the row's value
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, :1])
            m_ref[b] = m_next
            l_ref[b] = alpha * l_ref[b] + jnp.sum(p, axis=1, keepdims=True)
            v = v_ref[b]
            pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc_ref[b] = alpha[:, :1] * acc_ref[b] + pv

    @pl.when(kj == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, :, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "batch_per_step", "buffers", "kv_index_map"))
def flex_attention(q, k, v, rel_pos_bias, *, bq, bk, batch_per_step, buffers, kv_index_map):
    batch, heads, seq, head_dim = q.shape
    nb = batch_per_step
    grid = (batch // nb, heads, seq // bq, seq // bk)

    def q_map(bb, h, i, j):
        return (bb, h, i, 0)

    def kv_block(i, j):
        needed = j * bk <= (i + 1) * bq - 1
        if kv_index_map == "clamp":  # skipped steps keep the last needed block: no new DMA
            return jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        if kv_index_map == "next_row":  # skipped steps fetch block 0, which the next q block starts with
            return jnp.where(needed, j, 0)
        return j

    def kv_map(bb, h, i, j):
        return (bb, h, kv_block(i, j), 0)

    def bias_map(bb, h, i, j):
        return (h, i, kv_block(i, j))

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    kernel = functools.partial(flex_attention_kernel, sm_scale=head_dim**-0.5)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((nb, sq, bq, head_dim), q_map),
            pl.BlockSpec((nb, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((nb, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((sq, bq, bk), bias_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((nb, sq, bq, head_dim), q_map),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((nb, bq, 128), jnp.float32),  # m: running row max per batch element
            pltpu.VMEM((nb, bq, 128), jnp.float32),  # l: running row sum of exp per batch element
            pltpu.VMEM((nb, bq, head_dim), jnp.float32),  # acc: unnormalised output per batch element
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )(q, k, v, rel_pos_bias)


def workload(q, k, v, rel_pos_bias):
    s = SCHEDULE
    return flex_attention(
        q, k, v, rel_pos_bias, bq=s["block_q"], bk=s["block_k"], batch_per_step=s["batch_per_step"],
        buffers=s["buffers"], kv_index_map=s["kv_index_map"],
    )
