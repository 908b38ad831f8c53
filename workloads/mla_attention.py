"""3p mla_attention: DeepSeek-V3 multi-head latent attention (prefill), bf16.

Inputs (spec 3p): ``split(key(42), 8)[0..6]`` -> x (B=4, S=2048, E=7168) N(0,1) and the
weights q_down (E, 1536), q_up (1536, H·192), kv_down (E, 512+64), k_up (512, H·128),
v_up (512, H·128), o_proj (H·128, E), each N·0.02, bf16, H=128 (key 7 is unused).
Math: q = (x@q_down)@q_up as (B,S,H,192) = [q_nope (128) ‖ q_rope (64)]; kv = x@kv_down,
latent = kv[..., :512], k_rope_raw = kv[..., 512:] (one head shared by all); k_nope =
latent@k_up, v = latent@v_up, each (B,S,H,128). RoPE, rotate-half, on q_rope and on
k_rope_raw broadcast to every head: freq_i = θ^(-2i/64), angle = pos·freq_i, cos and sin
computed in f32 and cast to bf16; [a, b] -> [a·cos - b·sin, b·cos + a·sin]. Then causal
attention of q = [q_nope ‖ q_rope], k = [k_nope ‖ k_rope] (192 dims) over v (128 dims)
with scale 192^-0.5, mask -1e9 and softmax, and the (B,S,H·128) result @ o_proj.
Output (4, 2048, 7168) bf16, tolerance 5e-2/1e-2 (MaxKernel's yaml).

The check runs at batch=2, seq_len=2048, num_heads=2, emb_dim=1024, q_lora_rank=256,
kv_lora_rank=128, keeping the per-head structure (nope 128, rope 64, v 128) and θ. Batch
stays 2 because the kernels' grids have a batch axis: at batch 1 it would have one step, and
the judge would climb to the next rung for every candidate.
seq_len stays 2048, the largest block in the template's space and jax's tuned expert
tiling (2048/2048/1024), so every schedule is checked with its own tiling.

Input fix, for the check size only: the weights' scale 0.02 is the spec's at the full
fan-ins (E, 1536, 512, H·128). At smaller dimensions each weight is drawn as
N·0.02·sqrt(full fan-in / fan-in), which keeps every activation, the attention logits and
the output at their full-size magnitudes (output std ~0.3). With a flat 0.02 the check
size's output std is ~0.003, and all but 0.02% of it is under atol: the check would be
nearly vacuous (an all-zero output misses on a few hundred of 4M values, all in the first
rows). At the full size the factor is exactly 1: seed 0 gives the spec's inputs bit for bit.

The check's seeds (never 0) draw x structured (per-token and per-feature means and scales,
correlated tokens, outliers) at root-mean-square ``STRUCTURED_X_SCALE`` = 0.6, and the weights
with scales, low rank and outliers but no means (``WEIGHT_STRUCTURE``). At x's full scale the
correlated tokens' q and k reach scores of ~40, where the bf16 reference's rounding alone
exceeds the tolerance (a correct f32 attention failed by 3-7x); at 0.6 the scores stay below
~15 and the output's std is ~0.46, above seed 0's 0.31.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .base import (
    attention_knobs,
    indivisible,
    Knob,
    over_vmem,
    require_positive_ints,
    ScheduleSpace,
    seeded_normal,
    tile_bytes,
    WEIGHT_STRUCTURE,
    Workload,
)
from .essential import causal_pairs, io_bytes

# The root-mean-square of x at seeds other than 0 (see the docstring).
STRUCTURED_X_SCALE = 0.6


def rope_tables(seq_len, rope_dim, theta, dtype):
    """cos and sin of pos·θ^(-2i/rope_dim), computed in f32 and cast to ``dtype``."""
    freqs = 1.0 / (theta ** (jnp.arange(0, rope_dim, 2, dtype=jnp.float32) / rope_dim))
    angles = jnp.outer(jnp.arange(seq_len, dtype=jnp.float32), freqs)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def rotate_half_rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class MLAAttention(Workload):
    name = "mla_attention"
    jaxbench_id = "3p"
    category = "attention"
    description = "DeepSeek-V3 multi-head latent attention: LoRA projections, RoPE, causal attention, x (4,2048,7168) bf16"
    defaults = {"batch": 4, "seq_len": 2048, "emb_dim": 7168, "num_heads": 128, "q_lora_rank": 1536,
                "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                "rope_theta": 10000, "dtype": "bfloat16"}
    check_overrides = {"batch": 2, "seq_len": 2048, "num_heads": 2, "emb_dim": 1024, "q_lora_rank": 256,
                       "kv_lora_rank": 128}
    atol = 5e-2
    rtol = 1e-2
    template_file = "mla_attention.py"
    expert_file = "mla_attention.py"

    def weight_scale(self, config, fan_in_key):
        """0.02 at the spec's fan-in, scaled to keep activations' magnitudes at other sizes."""
        full, now = self.defaults, config
        if fan_in_key == "o_proj":
            full_fan_in = full["num_heads"] * full["v_head_dim"]
            fan_in = now["num_heads"] * now["v_head_dim"]
        else:
            full_fan_in, fan_in = full[fan_in_key], now[fan_in_key]
        return 0.02 if fan_in == full_fan_in else 0.02 * math.sqrt(full_fan_in / fan_in)

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        keys = jax.random.split(jax.random.key(42 + seed), 8)
        B, S, E, H = config["batch"], config["seq_len"], config["emb_dim"], config["num_heads"]
        ql, kvl = config["q_lora_rank"], config["kv_lora_rank"]
        nope, rope, vd = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]

        def weight(k, shape, fan_in_key):
            return seeded_normal(k, shape, dt, seed, scale=self.weight_scale(config, fan_in_key), **WEIGHT_STRUCTURE)

        x = seeded_normal(keys[0], (B, S, E), dt, seed, scale=1.0 if seed == 0 else STRUCTURED_X_SCALE)
        q_down = weight(keys[1], (E, ql), "emb_dim")
        q_up = weight(keys[2], (ql, H * (nope + rope)), "q_lora_rank")
        kv_down = weight(keys[3], (E, kvl + rope), "emb_dim")
        k_up = weight(keys[4], (kvl, H * nope), "kv_lora_rank")
        v_up = weight(keys[5], (kvl, H * vd), "kv_lora_rank")
        o_proj = weight(keys[6], (H * vd, E), "o_proj")
        return x, q_down, q_up, kv_down, k_up, v_up, o_proj

    def reference(self, config, x, q_down, q_up, kv_down, k_up, v_up, o_proj):
        # JAXBench's plain-JAX baseline: everything in the input dtype, default precision.
        B, S, _ = x.shape
        H, kvl = config["num_heads"], config["kv_lora_rank"]
        nope, rope, vd = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
        q = jnp.dot(jnp.dot(x, q_down), q_up).reshape(B, S, H, nope + rope)
        q_nope, q_rope = q[..., :nope], q[..., nope:]
        kv = jnp.dot(x, kv_down)
        latent, k_rope_raw = kv[..., :kvl], kv[..., kvl:]
        k_nope = jnp.dot(latent, k_up).reshape(B, S, H, nope)

        cos, sin = rope_tables(S, rope, config["rope_theta"], x.dtype)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        k_rope = jnp.broadcast_to(k_rope_raw[:, :, None, :], (B, S, H, rope))
        q_rope = rotate_half_rope(q_rope, cos, sin)
        k_rope = rotate_half_rope(k_rope, cos, sin)
        v = jnp.dot(latent, v_up).reshape(B, S, H, vd)
        q = jnp.concatenate([q_nope, q_rope], axis=-1).transpose(0, 2, 1, 3)  # (B, H, S, 192)
        k = jnp.concatenate([k_nope, k_rope], axis=-1).transpose(0, 2, 1, 3)
        v = v.transpose(0, 2, 1, 3)

        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (nope + rope) ** -0.5
        scores = jnp.where(jnp.tril(jnp.ones((S, S))), scores, -1e9)
        attn = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        return jnp.dot(attn.transpose(0, 2, 1, 3).reshape(B, S, H * vd), o_proj)

    def essential_work(self, config):
        # The projections in full; the causal attention's QKᵀ (192 dims) and PV (128) only for
        # the S(S+1)/2 (query, key) pairs at or below the diagonal. (Absorbing k_up/v_up into
        # the latent, as decode does, costs more here: 576-dim scores and 512-dim values.)
        B, S, E, H = config["batch"], config["seq_len"], config["emb_dim"], config["num_heads"]
        ql, kvl = config["q_lora_rank"], config["kv_lora_rank"]
        nope, rope, vd = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
        proj = 2 * B * S * (E * ql + ql * H * (nope + rope) + E * (kvl + rope) + kvl * H * (nope + vd) + H * vd * E)
        attn = 2 * B * H * causal_pairs(S) * (nope + rope + vd)
        return float(io_bytes(self, config)), float(proj + attn)

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        seq, dqk, dv = config["seq_len"], config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["v_head_dim"]
        dims = {"block_q": ("seq_len", seq), "block_k": ("seq_len", seq)}

        def check(s):
            bq, bk, nbuf = s["block_q"], s["block_k"], s["buffers"]
            vmem = (
                2 * tile_bytes((bq, dqk), dt)  # q, double-buffered
                + nbuf * (tile_bytes((bk, dqk), dt) + tile_bytes((bk, dv), dt))  # k and v
                + 2 * tile_bytes((bq, dv), dt)  # out, double-buffered
                + 2 * tile_bytes((bq, 128), "float32") + tile_bytes((bq, dv), "float32")  # m, l, acc
            )
            # As in flash_attention, the (block_q, block_k) f32 score tile is not counted:
            # v6e compiles block_q = block_k = 2048 at the full size.
            return indivisible(dims, s) or over_vmem(vmem)

        return ScheduleSpace(attention_knobs(q_tiles="q, out, m, l, acc", kv_index_maps=("plain", "clamp")), check)

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("batch", "seq_len", "emb_dim", "num_heads", "q_lora_rank",
                                                  "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                  "v_head_dim", "rope_theta"))
        if config["seq_len"] % 128:
            raise ValueError(f"{self.name}: seq_len={config['seq_len']} must be a multiple of 128 (the smallest block)")
        if config["qk_rope_head_dim"] % 2:
            raise ValueError(f"{self.name}: qk_rope_head_dim={config['qk_rope_head_dim']} must be even (rotate-half)")
        for key in ("qk_nope_head_dim", "v_head_dim"):
            if config[key] % 128:
                raise ValueError(f"{self.name}: {key}={config[key]} must be a multiple of 128 (the lane width)")
        if str(config.get("dtype", "bfloat16")) not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"{self.name}: dtype {config['dtype']!r} is not a float dtype")
