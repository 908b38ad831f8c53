"""15p retnet_retention: RetNet-6.7B multi-scale retention, parallel form.

Inputs (spec 15p): ``split(key(42), 3)`` -> q, k, v, each (B=4, H=16, S=4096, D=256) bf16,
N(0,1). Math per (b, h): γ_h = 1 - 2^(-5-h); decay D_ij = exp(log γ_h · max(i-j, 0)) ·
[i >= j]; A = (q·kᵀ in f32, no 1/√d scale) ⊙ D; each row divided by max(Σ_j |A_ij|, 1);
cast to bf16 and multiplied by v. Output (4, 16, 4096, 256) bf16, tolerance 1e-2/1e-2.
JAXBench's program exponentiates log γ_h · (i-j) without the max(·, 0): above the diagonal
head 0's exp overflows to inf from j - i = 2795 and inf · 0 is NaN, so at seq_len >= 2796
(the full size included) its first rows of head 0 are NaN. The reference keeps the guard, one
elementwise max (JAXBench's file is priced at 1.000002x of it), so that the full-size check
on a TPU has a finite target.
The check's seeds (never 0) draw q, k and v structured (per-position and per-dimension means
and scales, correlated positions, outliers): the retention sums are not sums of zero-mean
noise, so a kernel that approximates the normaliser from the inputs' moments fails.

The check runs at batch=1, seq_len=1024 with all 16 heads and head_dim 256. The heads
are not shrunk: head h has its own decay, and only the slow ones (γ_h -> 1 for large h)
reach keys more than a few hundred positions back, so a kernel that drops far kv blocks
or uses the wrong head's γ is caught only with them. seq_len stays a multiple of the
largest block in the space, so every schedule is checked with its own tiling, diagonal
and skipped blocks included. head_dim is the lane dimension and is kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import (
    attention_knobs,
    indivisible,
    Knob,
    over_vmem,
    ScheduleSpace,
    seeded_normal,
    tile_bytes,
    validate_attention_config,
    Workload,
)
from .essential import io_bytes

BLOCKS = (128, 256, 512, 1024)


class RetNetRetention(Workload):
    name = "retnet_retention"
    jaxbench_id = "15p"
    category = "linear attention"
    description = "multi-scale retention (parallel form), q,k,v (4,16,4096,256) bf16, per-head decay"
    defaults = {"batch": 4, "seq_len": 4096, "num_heads": 16, "head_dim": 256, "d_model": 4096,
                "dtype": "bfloat16"}
    check_overrides = {"batch": 1, "seq_len": 1024}
    atol = 1e-2
    rtol = 1e-2
    template_file = "retnet_retention.py"

    def shape(self, config):
        return (config["batch"], config["num_heads"], config["seq_len"], config["head_dim"])

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        kq, kk, kv = jax.random.split(jax.random.key(42 + seed), 3)
        shape = self.shape(config)
        return tuple(seeded_normal(k, shape, dt, seed) for k in (kq, kk, kv))

    def reference(self, config, query, key, value):
        # JAXBench's baseline: decay and scores in f32, the normalised scores cast back to
        # the input dtype before the product with v.
        heads, seq = query.shape[1], query.shape[2]
        gammas = 1.0 - jnp.exp2(-5.0 - jnp.arange(heads, dtype=jnp.float32))
        positions = jnp.arange(seq, dtype=jnp.float32)
        distance = positions[:, None] - positions[None, :]
        causal_mask = (distance >= 0).astype(jnp.float32)
        log_gamma = jnp.log(gammas)
        decay = jnp.exp(log_gamma[:, None, None] * jnp.maximum(distance, 0.0)[None, :, :])
        decay = decay * causal_mask[None, :, :]
        qk = jnp.einsum("bhsd,bhtd->bhst", query.astype(jnp.float32), key.astype(jnp.float32))
        qk = qk * decay[None, :, :, :]
        retention_sum = jnp.maximum(jnp.sum(jnp.abs(qk), axis=-1, keepdims=True), 1.0)
        qk = qk / retention_sum
        return jnp.einsum("bhst,bhtd->bhsd", qk.astype(query.dtype), value)

    def essential_work(self, config):
        # The normaliser sums |q_i·k_j| decay_ij, so QKᵀ is needed for every causal pair whose f32
        # decay is a normal number (below it TPU flushes to 0: only head 0's farthest keys); the
        # numerator q_i · sum_j decay_ij k_j v_jᵀ may instead use the recurrent form, a DxD state
        # update and readout per position (4 S D² per head), when that is cheaper than PV.
        b, h, s, d = self.shape(config)
        gammas = 1.0 - np.exp2(-5.0 - np.arange(h, dtype=np.float32))
        decay = np.exp(np.log(gammas)[:, None] * np.arange(s, dtype=np.float32)[None, :])  # (head, distance)
        pairs = ((decay >= np.finfo(np.float32).tiny) * (s - np.arange(s))).sum(axis=1)  # per head
        flops = b * sum(2 * d * p + min(2 * d * p, 4 * s * d * d) for p in pairs.tolist())
        return float(io_bytes(self, config)), float(flops)

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        seq, d = config["seq_len"], config["head_dim"]
        dims = {"block_q": ("seq_len", seq), "block_k": ("seq_len", seq)}

        def check(s):
            bq, bk = s["block_q"], s["block_k"]
            vmem = (
                2 * tile_bytes((bq, d), dt)  # q, double-buffered
                + 2 * s["buffers"] * tile_bytes((bk, d), dt)  # k and v
                + 2 * tile_bytes((bq, d), dt)  # out, double-buffered
                + tile_bytes((bq, d), "float32") + tile_bytes((bq, 128), "float32")  # acc, normaliser
                + tile_bytes((bq, bk), "float32")  # the score tile
            )
            # Only one f32 (block_q, block_k) tile is counted: v6e compiles the decay and the
            # decayed scores in place (the same kernel shape compiles 2048 x 2048 at head_dim 64).
            return indivisible(dims, s) or over_vmem(vmem)

        return ScheduleSpace(attention_knobs(q_tiles="q, out, accumulator", kv_index_maps=("plain", "clamp"),
                                             blocks=BLOCKS), check)

    def validate_config(self, config):
        validate_attention_config(self.name, config, ("batch", "num_heads", "seq_len", "head_dim", "d_model"))
