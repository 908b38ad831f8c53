"""Multi-scale retention (parallel form) as a Pallas TPU kernel: decay-masked q·kᵀ with
row normalisation, accumulated over kv blocks.

Grid (batch, heads, q blocks, kv blocks). Each step scores one (block_q, block_k) tile
of q·kᵀ in f32, multiplies it by head h's decay γ_h^(i-j) (zero above the diagonal),
adds the tile's row sums of |A| to a running normaliser and A·v to an f32 accumulator.
The last kv step divides by max(Σ|A|, 1): the normaliser is one scalar per row, so
dividing after the sum equals the spec's divide-then-multiply up to bf16 rounding of A.
KV blocks wholly above the diagonal are skipped with pl.when; ``kv_index_map`` decides
what the k/v pipeline fetches on those steps. log γ_h comes in through SMEM.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "buffers": 2, "kv_index_map": "plain"}


def retention_kernel(log_gamma_ref, q_ref, k_ref, v_ref, o_ref, acc_ref, norm_ref):
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    h, qi, kj = pl.program_id(1), pl.program_id(2), pl.program_id(3)

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
        distance = (rows - cols).astype(jnp.float32)
        decay = jnp.exp(log_gamma_ref[h] * jnp.maximum(distance, 0.0)) * (distance >= 0).astype(jnp.float32)
        a = s * decay
        norm_ref[...] += jnp.sum(jnp.abs(a), axis=1, keepdims=True)  # lane-broadcast over 128
        acc_ref[...] += jnp.dot(a.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kj == pl.num_programs(3) - 1)
    def _store():
        norm = jnp.maximum(norm_ref[...][:, :1], 1.0)
        o_ref[...] = (acc_ref[...] / norm).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "buffers", "kv_index_map"))
def retention(q, k, v, log_gamma, *, bq, bk, buffers, kv_index_map):
    batch, heads, seq, head_dim = q.shape

    def q_map(b, h, i, j):
        return (b, h, i, 0)

    def kv_map(b, h, i, j):
        if kv_index_map == "clamp":  # skipped steps keep the diagonal block: no new DMA
            j = jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        return (b, h, j, 0)

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    return pl.pallas_call(
        retention_kernel,
        grid=(batch, heads, seq // bq, seq // bk),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),  # log γ per head, whole
            pl.BlockSpec((sq, sq, bq, head_dim), q_map),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
            pl.BlockSpec((sq, sq, bk, head_dim), kv_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((sq, sq, bq, head_dim), q_map),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((bq, head_dim), jnp.float32),  # Σ_j A_ij v_j
            pltpu.VMEM((bq, 128), jnp.float32),  # Σ_j |A_ij|, every lane alike
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )(log_gamma, q, k, v)


def workload(query, key, value):
    s = SCHEDULE
    heads = query.shape[1]
    # γ_h = 1 - 2^(-5-h), as the spec computes it (f32).
    log_gamma = jnp.log(1.0 - jnp.exp2(-5.0 - jnp.arange(heads, dtype=jnp.float32)))
    return retention(query, key, value, log_gamma, bq=s["block_q"], bk=s["block_k"],
                     buffers=s["buffers"], kv_index_map=s["kv_index_map"])
