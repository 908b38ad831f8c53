"""4p sparse_attention: splash-style causal GQA, Llama-3.1-70B shape (MaxText), BHSD.

Inputs (spec 4p): ``split(key(42), 3)`` -> q (B=4, Hq=64, S=4096, D=128) = N(0,1)·128^-0.5
(pre-scaled at input generation) and k, v (4, Hkv=8, 4096, 128), bf16. Math, per batch
element: query head h uses KV head h // 8 (KV heads repeated 8 times); s = q·kᵀ with no
scale inside the workload; where key j > query i, s = -1e30; softmax over keys;
out = p·v: (4, 64, 4096, 128) bf16. Tolerance 1e-2 / 1e-2.

Input fix: JAXBench draws k and v as N(0,1)·0.02. Then the scores are ~N(0, 0.02²), the
softmax is nearly uniform over the causal prefix, and outputs are averages of ~0.02-sized
values: only 0.16% of them exceed atol (measured at the check size). An all-zero output,
a kernel without the causal mask or one that maps query heads to the wrong KV head then
fail only on the first rows of each head, and a kernel that skips an off-diagonal kv block
(keys 512..1023 for the queries from 1536 on) passes. Here k and v are N(0,1) (q keeps
its pre-scaling, so scores are ~N(0,1) as in ordinary attention): 86% of outputs exceed
atol, each of those wrong kernels fails, and the bf16 reference stays within ~0.6 of the
tolerance of the exact answer. Math, shapes, dtypes and keys are JAXBench's. The check's
seeds (never 0) draw q (at its pre-scale) and k with ``QK_STRUCTURE`` and v fully
structured, as flash_attention does, but at a root-mean-square of 0.5 (``TIGHT_V_SCALE``):
the bf16 reference's error grows with v's values against an atol of 1e-2; at v's full scale a
correct f32 kernel used up to 1.1 of the tolerance (0.4-0.7 at 0.5, up to 0.9 with i.i.d. v).

The check runs at batch=1, seq_len=2048, 2 KV heads with 16 query heads, head_dim=128.
Batch only repeats independent problems. Two KV heads keep a kernel with the wrong head
mapping failing, and ``check_config`` keeps the group size (8 query heads per KV head at
full size), so every ``heads_per_step`` the full size allows is checked. seq_len stays a
multiple of the largest block (2048, also the expert's splash tiling), so a kernel tuned for
the full size is checked with its own tiling. head_dim, the lane dimension, is not shrunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import QK_STRUCTURE, seeded_normal, TIGHT_V_SCALE
from .grouped_query import GroupedQueryAttention


class SparseAttention(GroupedQueryAttention):
    name = "sparse_attention"
    jaxbench_id = "4p"
    category = "attention"
    description = "splash-style causal GQA, q (4,64,4096,128) pre-scaled, k,v (4,8,4096,128) bf16, BHSD"
    defaults = {"batch": 4, "seq_len": 4096, "num_query_heads": 64, "num_kv_heads": 8, "head_dim": 128,
                "dtype": "bfloat16"}
    check_overrides = {"batch": 1, "seq_len": 2048}
    atol = 1e-2
    rtol = 1e-2
    template_file = "sparse_attention.py"
    expert_file = "sparse_attention.py"
    heads_in_lanes = False

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        kq, kk, kv = jax.random.split(jax.random.key(42 + seed), 3)
        b, s, d = config["batch"], config["seq_len"], config["head_dim"]
        q = seeded_normal(kq, (b, config["num_query_heads"], s, d), dt, seed, scale=d**-0.5, **QK_STRUCTURE)
        k = seeded_normal(kk, (b, config["num_kv_heads"], s, d), dt, seed, **QK_STRUCTURE)  # JAXBench: ·0.02
        v = seeded_normal(kv, (b, config["num_kv_heads"], s, d), dt, seed,  # JAXBench: ·0.02
                          scale=1.0 if seed == 0 else TIGHT_V_SCALE)
        return q, k, v

    def reference(self, config, q, k, v):
        # JAXBench's plain-JAX baseline: repeat KV heads, no scale, mask -1e30, input dtype.
        group = q.shape[1] // k.shape[1]
        seq = q.shape[2]
        k = jnp.repeat(k, group, axis=1)
        v = jnp.repeat(v, group, axis=1)
        attn = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        attn = jnp.where(mask, attn, -1e30)
        attn = jax.nn.softmax(attn, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", attn, v)
