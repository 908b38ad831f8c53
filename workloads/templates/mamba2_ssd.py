"""Mamba-2 SSD (quadratic, "attention" form) as a Pallas TPU kernel: decay-masked q·kᵀ
with row normalisation, accumulated over kv blocks.

Grid (batch, heads, q blocks, kv blocks). Each step scores one (block_q, block_k) tile
of q·kᵀ in f32, multiplies it by the selective decay L_ij = exp(c_i - c_j) (zero above
the diagonal), adds the tile's signed row sums to a running normaliser and A·v to an f32
accumulator. The last kv step divides by the spec's normaliser (r -> 1 where |r| < 1e-6,
then max(|r|, 1)): it is one scalar per row, so dividing after the sum equals the spec's
divide-then-multiply up to bf16 rounding of A. c, the cumulative log-decay over the whole
sequence, is computed in f32 outside the kernel exactly as the spec does, and comes in
twice: as a column (the queries' c_i) and as a row (the keys' c_j). KV blocks wholly
above the diagonal are skipped with pl.when; ``kv_index_map`` decides what the k/v
pipeline fetches on those steps.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "buffers": 2, "kv_index_map": "plain"}


def ssd_kernel(c_col_ref, c_row_ref, q_ref, k_ref, v_ref, o_ref, acc_ref, norm_ref):
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    qi, kj = pl.program_id(2), pl.program_id(3)

    @pl.when(kj == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)
        norm_ref[...] = jnp.zeros_like(norm_ref)

    @pl.when(kj * block_k <= (qi + 1) * block_q - 1)  # the block has keys at or before some query
    def _compute():
        # q·kᵀ with f32 accumulation: exact products of the bf16 inputs, as the spec's f32 einsum.
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = kj * block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        # exp(-1e30) = 0 above the diagonal, as the spec writes it (and no overflow there).
        decay = jnp.exp(jnp.where(cols <= rows, c_col_ref[...] - c_row_ref[...], -1e30))
        a = s * decay
        norm_ref[...] += jnp.sum(a, axis=1, keepdims=True)  # signed; lane-broadcast over 128
        acc_ref[...] += jnp.dot(a.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kj == pl.num_programs(3) - 1)
    def _store():
        r = norm_ref[...][:, :1]
        r = jnp.where(jnp.abs(r) < 1e-6, 1.0, r)
        o_ref[...] = (acc_ref[...] / jnp.maximum(jnp.abs(r), 1.0)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "buffers", "kv_index_map"))
def ssd(q, k, v, c, *, bq, bk, buffers, kv_index_map):
    batch, heads, seq, head_dim = q.shape

    def q_map(b, h, i, j):
        return (b, h, i, 0)

    def kv_map(b, h, i, j):
        if kv_index_map == "clamp":  # skipped steps keep the diagonal block: no new DMA
            j = jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        return (b, h, j, 0)

    def c_row_map(b, h, i, j):
        b, h, j, _ = kv_map(b, h, i, j)
        return (b, h, 0, j)

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    return pl.pallas_call(
        ssd_kernel,
        grid=(batch, heads, seq // bq, seq // bk),
        in_specs=[
            pl.BlockSpec((sq, sq, bq, 1), q_map),  # c_i of the block's queries, a column
            pl.BlockSpec((sq, sq, 1, bk), c_row_map, **pipeline),  # c_j of the block's keys, a row
            pl.BlockSpec((sq, sq, bq, head_dim), q_map),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((sq, sq, bq, head_dim), q_map),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((bq, head_dim), jnp.float32),  # Σ_j A_ij v_j
            pltpu.VMEM((bq, 128), jnp.float32),  # Σ_j A_ij, every lane alike
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )(c[..., :, None], c[..., None, :], q, k, v)


def workload(query, key, value, A_log):
    s = SCHEDULE
    # The spec's cumulative log-decay, in f32 over the whole sequence.
    a = jax.nn.sigmoid(A_log.astype(jnp.float32))
    c = jnp.cumsum(jnp.log(a + 1e-8), axis=-1)
    return ssd(query, key, value, c, bq=s["block_q"], bk=s["block_k"],
               buffers=s["buffers"], kv_index_map=s["kv_index_map"])
