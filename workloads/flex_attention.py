"""5p flex_attention: causal attention with an additive per-head score bias, Llama-3.1-70B shape.

Inputs (spec 5p): ``split(key(42), 4)`` -> q, k, v (B=4, H=64, S=4096, D=128) and
rel_pos_bias (64, 4096, 4096), bf16, BHSD, the bias per head and shared across the batch.
Math: s = q·kᵀ·128^-0.5 + rel_pos_bias[h]; where key j > query i, s = -1e30; softmax over
keys; out = p·v: (4, 64, 4096, 128) bf16. Tolerance 1e-2 / 1e-2. There is no expert.

Input fix: JAXBench draws q ~ N(0,1) but k, v ~ N(0,1)·0.02 and the bias ~ N(0,1)·0.01.
Then the scores are ~N(0, 0.02²) plus a bias of 0.01: the softmax is nearly uniform over the
causal prefix and outputs are averages of ~0.02-sized values. Measured at the check size,
only 0.16% of outputs exceed atol, and a kernel that ignores rel_pos_bias entirely (or reads
another head's, or its transpose) passes the check. Here k ~ N(0,1)·0.5, v ~ N(0,1) and the
bias ~ N(0,1)·0.5, so q·kᵀ·D^-0.5 and the bias each carry half of the scores' unit
variance: ~80% of outputs exceed atol and a kernel without the bias fails on ~60% of them,
while the bf16 reference stays within 0.4 of the tolerance of the exact answer (with k and
the bias at N(0,1) the reference's own bf16 rounding exceeds the 1e-2 tolerance near the
first rows, so a correct kernel would fail). Math, shapes, dtypes and keys are JAXBench's.
The check's seeds (never 0) draw q and k with ``QK_STRUCTURE``, v fully structured at a
root-mean-square of 0.5 (``TIGHT_V_SCALE``: the bf16 reference errs in proportion), and the
bias structured (per-query and per-key offsets and scales, low rank) without outliers: a
bump of 3-5 in a score rounds too coarsely in the bf16 reference for the 1e-2 tolerance.

The check runs at batch=4, heads=2, seq_len=2048, head_dim=128. The batch stays a multiple
of the largest ``batch_per_step`` (4), so every schedule is checked with its own batch
blocking (the bias tile shared across batch elements); two heads keep a kernel that reads
the wrong head's bias failing. seq_len stays a multiple of the largest block (2048), so a
kernel tuned for the full size is checked with its own tiling, diagonal and skipped blocks
included. head_dim, the lane dimension, is not shrunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import (
    attention_knobs,
    indivisible,
    Knob,
    over_vmem,
    pow2_divisors,
    QK_STRUCTURE,
    ScheduleSpace,
    seeded_normal,
    TIGHT_V_SCALE,
    tile_bytes,
    validate_attention_config,
    Workload,
)
from .essential import causal_pairs, io_bytes


class FlexAttention(Workload):
    name = "flex_attention"
    jaxbench_id = "5p"
    category = "attention"
    description = "causal attention plus a per-head additive bias (64,4096,4096), q,k,v (4,64,4096,128) bf16"
    defaults = {"batch": 4, "seq_len": 4096, "num_heads": 64, "head_dim": 128, "dtype": "bfloat16"}
    check_overrides = {"batch": 4, "num_heads": 2, "seq_len": 2048}
    atol = 1e-2
    rtol = 1e-2
    template_file = "flex_attention.py"

    def validate_config(self, config):
        validate_attention_config(self.name, config, ("batch", "seq_len", "num_heads", "head_dim"))

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        kq, kk, kv, kb = jax.random.split(jax.random.key(42 + seed), 4)
        shape = (config["batch"], config["num_heads"], config["seq_len"], config["head_dim"])
        q = seeded_normal(kq, shape, dt, seed, **QK_STRUCTURE)
        k = seeded_normal(kk, shape, dt, seed, scale=0.5, **QK_STRUCTURE)  # JAXBench: ·0.02 (see above)
        v = seeded_normal(kv, shape, dt, seed, scale=1.0 if seed == 0 else TIGHT_V_SCALE)  # JAXBench: ·0.02
        bias_shape = (config["num_heads"], config["seq_len"], config["seq_len"])
        rel_pos_bias = seeded_normal(kb, bias_shape, dt, seed, scale=0.5, outliers=0.0)  # JAXBench: ·0.01
        return q, k, v, rel_pos_bias

    def reference(self, config, q, k, v, rel_pos_bias):
        # JAXBench's plain-JAX baseline: scaled scores plus the head's bias, mask -1e30, input dtype.
        seq, head_dim = q.shape[2], q.shape[3]
        attn = jnp.einsum("bhqd,bhkd->bhqk", q, k) * head_dim**-0.5 + rel_pos_bias[None]
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        attn = jnp.where(mask, attn, -1e30)
        attn = jax.nn.softmax(attn, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", attn, v)

    def essential_work(self, config):
        # Causal: QKᵀ, PV and the bias only for the S(S+1)/2 (query, key) pairs at or below the
        # diagonal (the masked bias entries are never read).
        b, h, s, d = config["batch"], config["num_heads"], config["seq_len"], config["head_dim"]
        itemsize = self.dtype(config).itemsize
        nbytes = io_bytes(self, config, skip=(3,)) + h * causal_pairs(s) * itemsize
        return float(nbytes), 2.0 * 2 * b * h * d * causal_pairs(s)

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        seq, d, batch = config["seq_len"], config["head_dim"], config["batch"]
        per_step = pow2_divisors(batch, 1, 4)

        def check(s):
            bq, bk, nb = s["block_q"], s["block_k"], s["batch_per_step"]
            msg = indivisible({"block_q": ("seq_len", seq), "block_k": ("seq_len", seq),
                               "batch_per_step": ("batch", batch)}, s)
            if msg:
                return msg
            vmem = (
                2 * nb * tile_bytes((bq, d), dt)  # q, double-buffered
                + 2 * s["buffers"] * nb * tile_bytes((bk, d), dt)  # k and v
                + s["buffers"] * tile_bytes((bq, bk), dt)  # the bias tile
                + 2 * nb * tile_bytes((bq, d), dt)  # o, double-buffered
                + 2 * nb * tile_bytes((bq, 128), "float32")  # m, l scratch per batch element
                + nb * tile_bytes((bq, d), "float32")  # acc scratch per batch element
            )
            # f32 score-sized temporaries, fitted to v6e compiles at the full size: the bias tile
            # in f32 plus one (block_q, block_k) score tile per batch element of the step.
            vmem += (1 + nb) * tile_bytes((bq, bk), "float32")
            return over_vmem(vmem)

        return ScheduleSpace(attention_knobs("k, v and bias", "q, o, m, l, acc and bias", after_blocks=Knob(
            "batch_per_step", per_step, 1,
            "batch elements per grid step: each rel_pos_bias tile is fetched once for all of them")), check)
