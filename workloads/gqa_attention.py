"""2p gqa_attention: grouped-query causal attention, Llama-3.1-405B shape (MaxText), BSHD.

Inputs (spec 2p): ``split(key(42), 3)`` -> query (B=4, S=4096, Hq=128, D=128) and key,
value (4, 4096, Hkv=8, 128), bf16, BSHD layout, N(0,1). Math: query head h uses KV head
h // (Hq/Hkv) (each KV head repeated 16 times consecutively); per (b, h) in BHSD,
s = q·kᵀ·128^-0.5; where key j > query i, s = -1e9; softmax over keys; out = p·v,
transposed back to BSHD: (4, 4096, 128, 128) bf16. Tolerance 5e-2 / 5e-2 (MaxKernel's
yaml). ``emb_dim`` (16384 = Hq·D) is JAXBench's metadata; a config must keep it equal to
num_query_heads·head_dim. The check's seeds (never 0) draw query and key with
``QK_STRUCTURE`` and value fully structured, as flash_attention does.

The check runs at batch=1, seq_len=2048, 2 KV heads with 32 query heads, head_dim=128.
Batch only repeats independent problems. Two KV heads keep a kernel that maps a query
head to the wrong KV head failing, and ``check_config`` keeps the group size (16 query
heads per KV head at full size) rather than shrinking the head counts independently,
so every ``heads_per_step`` the full size allows is checked. seq_len stays a multiple of
the largest block (2048, also the expert's splash tiling), so a kernel tuned for the full
size is checked with its own tiling, diagonal and skipped blocks included. head_dim, the
lane dimension, is not shrunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import QK_STRUCTURE, seeded_normal
from .grouped_query import GroupedQueryAttention


class GQAAttention(GroupedQueryAttention):
    name = "gqa_attention"
    jaxbench_id = "2p"
    category = "attention"
    description = "causal grouped-query attention, q (4,4096,128,128), k,v (4,4096,8,128) bf16, BSHD"
    defaults = {"batch": 4, "seq_len": 4096, "num_query_heads": 128, "num_kv_heads": 8, "head_dim": 128,
                "emb_dim": 16384, "dtype": "bfloat16"}
    check_overrides = {"batch": 1, "seq_len": 2048}
    atol = 5e-2
    rtol = 5e-2
    template_file = "gqa_attention.py"
    expert_file = "gqa_attention.py"
    heads_in_lanes = True
    positive_int_keys = GroupedQueryAttention.positive_int_keys + ("emb_dim",)

    def check_config(self):
        out = super().check_config()
        out["emb_dim"] = out["num_query_heads"] * out["head_dim"]
        return out

    def validate_config(self, config):
        super().validate_config(config)
        if config["emb_dim"] != config["num_query_heads"] * config["head_dim"]:
            raise ValueError(f"{self.name}: emb_dim={config['emb_dim']} must equal num_query_heads*head_dim="
                             f"{config['num_query_heads'] * config['head_dim']}")

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        kq, kk, kv = jax.random.split(jax.random.key(42 + seed), 3)
        b, s, d = config["batch"], config["seq_len"], config["head_dim"]
        query = seeded_normal(kq, (b, s, config["num_query_heads"], d), dt, seed, **QK_STRUCTURE)
        key = seeded_normal(kk, (b, s, config["num_kv_heads"], d), dt, seed, **QK_STRUCTURE)
        value = seeded_normal(kv, (b, s, config["num_kv_heads"], d), dt, seed)
        return query, key, value

    def reference(self, config, query, key, value):
        # JAXBench's plain-JAX baseline: repeat KV heads (a new axis after the KV head axis,
        # repeated and folded in), BHSD attention in the input dtype.
        b, seq, q_heads, head_dim = query.shape
        group = q_heads // key.shape[2]
        k = jnp.repeat(key[:, :, :, None, :], group, axis=3).reshape(b, seq, q_heads, head_dim)
        v = jnp.repeat(value[:, :, :, None, :], group, axis=3).reshape(b, seq, q_heads, head_dim)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (query, k, v))
        attn = jnp.einsum("bhqd,bhkd->bhqk", q, k) * head_dim**-0.5
        mask = jnp.tril(jnp.ones((seq, seq)))
        attn = jnp.where(mask, attn, -1e9)
        attn = jax.nn.softmax(attn, axis=-1)
        out = jnp.einsum("bhqk,bhkd->bhqd", attn, v)
        return out.transpose(0, 2, 1, 3)
