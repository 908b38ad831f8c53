"""3p mla_attention: mirrors JAXBench's formulation of 3p (DeepSeek-V3 multi-head latent attention).

Low-rank query path (x @ q_down @ q_up, split per head into a 128-dim content part and a
64-dim rotary part), a shared latent (x @ kv_down) expanded into per-head keys and values,
one rotary key head broadcast to every head, rotate-half RoPE with cos/sin tables built in
f32 and cast to the activation dtype, causal attention over the concatenated 192-dim
query/key heads (scale 192^-0.5, -1e9 on future keys) and the output projection.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "deepseek_v3_mla",
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


def _rotary_tables(dim, length, theta, dtype):
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    phase = jnp.outer(jnp.arange(length, dtype=jnp.float32), inv_freq)
    return jnp.cos(phase).astype(dtype), jnp.sin(phase).astype(dtype)


def _rotate(t, cos, sin):
    """Rotate-half RoPE on (B, S, H, d): [a, b] -> [a·cos - b·sin, b·cos + a·sin]."""
    half = t.shape[-1] // 2
    first, second = t[..., :half], t[..., half:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def create_inputs(dtype=jnp.bfloat16):
    cfg = CONFIG
    keys = jax.random.split(jax.random.PRNGKey(42), 8)
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


def workload(x, q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj):
    cfg = CONFIG
    rows, length, _ = x.shape
    heads, kv_rank = cfg["num_heads"], cfg["kv_lora_rank"]
    nope, rope, v_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]

    query = jnp.dot(jnp.dot(x, q_down_proj), q_up_proj).reshape(rows, length, heads, nope + rope)
    q_content, q_pos = query[..., :nope], query[..., nope:]
    compressed = jnp.dot(x, kv_down_proj)
    latent, shared_pos = compressed[..., :kv_rank], compressed[..., kv_rank:]
    k_content = jnp.dot(latent, k_up_proj).reshape(rows, length, heads, nope)

    cos, sin = _rotary_tables(rope, length, cfg["rope_theta"], x.dtype)
    k_pos = jnp.broadcast_to(shared_pos[:, :, None, :], (rows, length, heads, rope))
    q_pos = _rotate(q_pos, cos, sin)
    k_pos = _rotate(k_pos, cos, sin)
    values = jnp.dot(latent, v_up_proj).reshape(rows, length, heads, v_dim)

    q_all = jnp.concatenate([q_content, q_pos], axis=-1).transpose(0, 2, 1, 3)
    k_all = jnp.concatenate([k_content, k_pos], axis=-1).transpose(0, 2, 1, 3)
    values = values.transpose(0, 2, 1, 3)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q_all, k_all) * ((nope + rope) ** -0.5)
    allowed = jnp.tril(jnp.ones((length, length)))
    logits = jnp.where(allowed, logits, -1e9)
    weights = jax.nn.softmax(logits, axis=-1)
    mixed = jnp.einsum("bhqk,bhkd->bhqd", weights, values)
    mixed = mixed.transpose(0, 2, 1, 3).reshape(rows, length, heads * v_dim)
    return jnp.dot(mixed, o_proj)
