"""3p mla_attention, optimized: mirrors JAXBench's expert file for 3p.

The LoRA projections, rotate-half RoPE and output projection stay plain JAX; the causal
attention is the Pallas TPU flash-attention kernel shipped in jax (softmax scale
192^-0.5) with JAXBench's tiling (2048/2048/1024, one batch row per step, backward
blocks 128, unused). That kernel wants one head size for q, k and v that is a multiple of
128, so q and k are zero-padded from 192 to 256 dims and v from 128 to 256, and the
output is cut back to 128. As in JAXBench's file, the RoPE tables are left in f32 here.
"""
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

CONFIG = {
    "name": "deepseek_v3_mla_optimized",
    "model": "DeepSeek-V3-671B",
    "operator": "mla_attention",
    "batch": 4,
    "seq_len": 2048,
    "emb_dim": 7168,
    "num_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rope_theta": 10000,
}

# The kernel's head size: 192 (q, k) and 128 (v) padded up to the next multiple of 128.
_PAD_HEAD_DIM = 256

# Same tiling as 1p (tuned there for head_dim 128).
TUNED_PARAMS = {
    "block_q": 2048,
    "block_k_major": 2048,
    "block_k": 1024,
    "block_b": 1,
    "block_q_major_dkv": 128,
    "block_k_major_dkv": 128,
    "block_k_dkv": 128,
    "block_q_dkv": 128,
    "block_k_major_dq": 128,
    "block_k_dq": 128,
    "block_q_dq": 128,
}


def _rotate(t, cos, sin):
    half = t.shape[-1] // 2
    first, second = t[..., :half], t[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _pad_to(t, size):
    return jnp.pad(t, ((0, 0), (0, 0), (0, 0), (0, size - t.shape[-1])))


def create_inputs(dtype=jnp.bfloat16):
    cfg = CONFIG
    keys = jax.random.split(jax.random.key(42), 9)
    emb, heads = cfg["emb_dim"], cfg["num_heads"]
    q_rank, kv_rank = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]

    def weight(k, shape):
        return jax.random.normal(k, shape, dtype=dtype) * 0.02

    x = jax.random.normal(keys[0], (cfg["batch"], cfg["seq_len"], emb), dtype=dtype)
    return (
        x,
        weight(keys[1], (emb, q_rank)),
        weight(keys[2], (q_rank, heads * (nope + rope))),
        weight(keys[3], (emb, kv_rank + rope)),
        weight(keys[4], (kv_rank, heads * nope)),
        weight(keys[5], (kv_rank, heads * v_dim)),
        weight(keys[6], (heads * v_dim, emb)),
    )


def workload(x, q_down, q_up, kv_down, k_up, v_up, o_proj):
    cfg = CONFIG
    rows, length, heads = cfg["batch"], cfg["seq_len"], cfg["num_heads"]
    nope, rope, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qk_dim, kv_rank = nope + rope, cfg["kv_lora_rank"]

    query = jnp.dot(jnp.dot(x, q_down), q_up).reshape(rows, length, heads, qk_dim)
    q_content, q_pos = query[..., :nope], query[..., nope:]
    compressed = jnp.dot(x, kv_down)
    k_content = jnp.dot(compressed[:, :, :kv_rank], k_up).reshape(rows, length, heads, nope)
    values = jnp.dot(compressed[:, :, :kv_rank], v_up).reshape(rows, length, heads, v_dim)

    inv_freq = 1.0 / (cfg["rope_theta"] ** (jnp.arange(0, rope, 2, dtype=jnp.float32) / rope))
    phase = jnp.outer(jnp.arange(length), inv_freq)
    cos, sin = jnp.cos(phase)[None, :, None, :], jnp.sin(phase)[None, :, None, :]
    q_pos = _rotate(q_pos, cos, sin)
    shared_pos = jnp.broadcast_to(compressed[:, :, kv_rank:][:, :, None, :], (rows, length, heads, rope))
    k_pos = _rotate(shared_pos, cos, sin)

    q_all = _pad_to(jnp.concatenate([q_content, q_pos], axis=-1), _PAD_HEAD_DIM).transpose(0, 2, 1, 3)
    k_all = _pad_to(jnp.concatenate([k_content, k_pos], axis=-1), _PAD_HEAD_DIM).transpose(0, 2, 1, 3)
    v_all = _pad_to(values, _PAD_HEAD_DIM).transpose(0, 2, 1, 3)

    out = flash_attention(q_all, k_all, v_all, causal=True, sm_scale=qk_dim**-0.5,
                          block_sizes=BlockSizes(**TUNED_PARAMS))
    out = out[..., :v_dim].transpose(0, 2, 1, 3).reshape(rows, length, heads * v_dim)
    return jnp.dot(out, o_proj)
