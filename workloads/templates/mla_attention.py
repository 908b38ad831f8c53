"""DeepSeek-V3 multi-head latent attention with a Pallas TPU flash-attention core.

The LoRA projections, RoPE and the output projection are plain JAX, as in the reference.
The attention core is one pallas_call over the grid (batch, heads, q blocks, kv blocks):
each step scores a (block_q, block_k) tile of q·kᵀ over the 192 qk dims in f32, folds it
into a running row max m, row sum l and accumulator acc (f32 VMEM scratch) over the 128
v dims, and the last kv step writes acc / l. q/k and v keep their own head sizes (192
and 128; a block that spans a whole dimension needs no padding). KV blocks wholly above
the causal diagonal are skipped with pl.when; ``kv_index_map`` decides what the k/v
pipeline fetches on those steps.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_q": 512, "block_k": 512, "buffers": 2, "kv_index_map": "plain"}

MASK_VALUE = -1e9  # what the reference writes over scores of keys after the query


def attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, sm_scale):
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    qi, kj = pl.program_id(2), pl.program_id(3)

    @pl.when(kj == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(kj * block_k <= (qi + 1) * block_q - 1)  # the block has keys at or before some query
    def _compute():
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * sm_scale
        rows = qi * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = kj * block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols <= rows, s, MASK_VALUE)

        m_prev = m_ref[...]  # (block_q, 128): every lane holds the row's value
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        m_ref[...] = m_next
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] = alpha[:, :1] * acc_ref[...] + pv

    @pl.when(kj == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bq", "bk", "buffers", "kv_index_map"))
def causal_attention(q, k, v, *, bq, bk, buffers, kv_index_map):
    """q, k (B, H, S, Dqk) and v (B, H, S, Dv) -> (B, H, S, Dv), scale Dqk^-0.5."""
    batch, heads, seq, dqk = q.shape
    dv = v.shape[-1]

    def q_map(b, h, i, j):
        return (b, h, i, 0)

    def kv_map(b, h, i, j):
        if kv_index_map == "clamp":  # skipped steps keep the diagonal block: no new DMA
            j = jnp.minimum(j, ((i + 1) * bq - 1) // bk)
        return (b, h, j, 0)

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    sq = pl.Squeezed()
    return pl.pallas_call(
        functools.partial(attention_kernel, sm_scale=dqk**-0.5),
        grid=(batch, heads, seq // bq, seq // bk),
        in_specs=[
            pl.BlockSpec((sq, sq, bq, dqk), q_map),
            pl.BlockSpec((sq, sq, bk, dqk), kv_map, **pipeline),
            pl.BlockSpec((sq, sq, bk, dv), kv_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((sq, sq, bq, dv), q_map),
        out_shape=jax.ShapeDtypeStruct(v.shape[:3] + (dv,), v.dtype),
        scratch_shapes=[
            pltpu.VMEM((bq, 128), jnp.float32),  # m: running row max
            pltpu.VMEM((bq, 128), jnp.float32),  # l: running row sum of exp
            pltpu.VMEM((bq, dv), jnp.float32),  # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
    )(q, k, v)


def rotate_half_rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def workload(x, q_down, q_up, kv_down, k_up, v_up, o_proj):
    c, s = CONFIG, SCHEDULE  # noqa: F821 - CONFIG is set by the environment before the call
    B, S, _ = x.shape
    H, kvl = c["num_heads"], c["kv_lora_rank"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]

    q = jnp.dot(jnp.dot(x, q_down), q_up).reshape(B, S, H, nope + rope)
    kv = jnp.dot(x, kv_down)
    latent, k_rope_raw = kv[..., :kvl], kv[..., kvl:]
    k_nope = jnp.dot(latent, k_up).reshape(B, S, H, nope)
    v = jnp.dot(latent, v_up).reshape(B, S, H, vd)

    # RoPE tables in f32, cast to the input dtype (the spec's rounding).
    freqs = 1.0 / (c["rope_theta"] ** (jnp.arange(0, rope, 2, dtype=jnp.float32) / rope))
    angles = jnp.outer(jnp.arange(S, dtype=jnp.float32), freqs)
    cos = jnp.cos(angles).astype(x.dtype)[None, :, None, :]
    sin = jnp.sin(angles).astype(x.dtype)[None, :, None, :]
    q_rope = rotate_half_rope(q[..., nope:], cos, sin)
    k_rope = rotate_half_rope(jnp.broadcast_to(k_rope_raw[:, :, None, :], (B, S, H, rope)), cos, sin)

    q = jnp.concatenate([q[..., :nope], q_rope], axis=-1).transpose(0, 2, 1, 3)  # (B, H, S, 192)
    k = jnp.concatenate([k_nope, k_rope], axis=-1).transpose(0, 2, 1, 3)
    out = causal_attention(q, k, v.transpose(0, 2, 1, 3), bq=s["block_q"], bk=s["block_k"],
                           buffers=s["buffers"], kv_index_map=s["kv_index_map"])
    return jnp.dot(out.transpose(0, 2, 1, 3).reshape(B, S, H * vd), o_proj)
