"""16p mamba2_ssd: Mamba-2-2.7B state space duality, quadratic (attention-like) form.

Inputs (spec 16p): ``split(key(42), 5)[0..3]`` -> q (C), k (B), v (x), each (B=4, H=64,
S=4096, D=64) bf16 N(0,1), and A_log (4, 64, 4096) f32 = N·0.5 - 4.0 (key 4 is unused).
Math per (b, h): a = σ(A_log); c = cumsum over S of log(a + 1e-8) (f32);
L_ij = exp(c_i - c_j) for i >= j, else exp(-1e30) = 0; P = (q·kᵀ in f32) ⊙ L; row sum
r_i = Σ_j P_ij, r_i -> 1 where |r_i| < 1e-6, P_i /= max(|r_i|, 1); cast to bf16 and
multiplied by v. Output (4, 64, 4096, 64) bf16, tolerance 5e-2/1e-2 (MaxKernel's yaml).
The check's seeds (never 0) draw q, k, v structured (per-position and per-dimension means and
scales, correlated positions, outliers) and A_log structured around -4, its rows the heads:
each head has its own mean decay and scale, positions share offsets across heads, and a few
outliers (A_log up to ~+1, a ~0.7 per step) let keys behind them count.

The check runs at batch=1, heads=2, seq_len=2048, head_dim=64. Every head has its own
random A_log, so heads only repeat independent problems (two still exercise the head
index maps). seq_len stays a multiple of the largest block in the space, so every
schedule is checked with its own tiling, diagonal and skipped blocks included. head_dim
is 64 at full size too: the blocks take the whole (64-lane) dimension.

The decay is strong (a ≈ 0.018, so L falls ~50x per position): P is nearly diagonal
and the output is close to ±v. The check still rejects zeros, constants, v itself, a
kernel that keeps only the diagonal and one that keeps only the diagonal 512-block (see
tests/test_mamba2_ssd.py), so the inputs are JAXBench's, unchanged. Keys more than one or
two positions back change the output by less than the tolerance: the check cannot tell
whether a kernel includes them (in f32 their decay underflows to 0 within ~30 positions).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
from .essential import causal_pairs, io_bytes


class Mamba2SSD(Workload):
    name = "mamba2_ssd"
    jaxbench_id = "16p"
    category = "scan / SSD"
    description = "Mamba-2 SSD, quadratic form: q,k,v (4,64,4096,64) bf16, A_log (4,64,4096) f32"
    defaults = {"batch": 4, "seq_len": 4096, "num_heads": 64, "head_dim": 64, "d_state": 128,
                "d_model": 2560, "dtype": "bfloat16"}
    check_overrides = {"batch": 1, "num_heads": 2, "seq_len": 2048}
    atol = 5e-2
    rtol = 1e-2
    template_file = "mamba2_ssd.py"

    def shape(self, config):
        return (config["batch"], config["num_heads"], config["seq_len"], config["head_dim"])

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        keys = jax.random.split(jax.random.key(42 + seed), 5)
        shape = self.shape(config)
        query, key, value = (seeded_normal(keys[i], shape, dt, seed) for i in range(3))
        A_log = seeded_normal(keys[3], shape[:3], jnp.float32, seed, scale=0.5, offset=-4.0)
        return query, key, value, A_log

    def reference(self, config, query, key, value, A_log):
        # JAXBench's baseline: decay, scores and normaliser in f32, the normalised scores
        # cast back to the input dtype before the product with v.
        seq = query.shape[2]
        a = jax.nn.sigmoid(A_log.astype(jnp.float32))
        log_a_cumsum = jnp.cumsum(jnp.log(a + 1e-8), axis=-1)
        diff = log_a_cumsum[:, :, :, None] - log_a_cumsum[:, :, None, :]
        causal = jnp.tril(jnp.ones((seq, seq), dtype=jnp.bool_))
        L = jnp.exp(jnp.where(causal[None, None, :, :], diff, -1e30))
        scores = jnp.einsum("bhsd,bhtd->bhst", query.astype(jnp.float32), key.astype(jnp.float32))
        scores = scores * L
        scores_sum = jnp.sum(scores, axis=-1, keepdims=True)
        scores_sum = jnp.where(jnp.abs(scores_sum) < 1e-6, 1.0, scores_sum)
        scores = scores / jnp.maximum(jnp.abs(scores_sum), 1.0)
        return jnp.einsum("bhst,bhtd->bhsd", scores.astype(query.dtype), value)

    def essential_work(self, config):
        # No |.| in the normaliser, so the whole SSD is linear in v: the recurrent (chunk size 1)
        # form needs a DxD state update and a readout per position, 4 S D² per head, far below
        # the causal quadratic form's 2 S² D (the normaliser's state is one more column, left out).
        b, h, s, d = self.shape(config)
        return float(io_bytes(self, config)), float(b * h * min(4 * s * d * d, 2 * 2 * d * causal_pairs(s)))

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        seq, d = config["seq_len"], config["head_dim"]
        dims = {"block_q": ("seq_len", seq), "block_k": ("seq_len", seq)}

        def check(s):
            bq, bk, nbuf = s["block_q"], s["block_k"], s["buffers"]
            vmem = (
                2 * tile_bytes((bq, d), dt)  # q, double-buffered
                + 2 * nbuf * tile_bytes((bk, d), dt)  # k and v
                + 2 * tile_bytes((bq, d), dt)  # out, double-buffered
                + 2 * tile_bytes((bq, 1), "float32") + nbuf * tile_bytes((1, bk), "float32")  # c column, c row
                + tile_bytes((bq, d), "float32") + tile_bytes((bq, 128), "float32")  # acc, normaliser
                + tile_bytes((bq, bk), "float32")  # the score tile
            )
            # Only one f32 (block_q, block_k) tile is counted: v6e compiles the decay and the
            # decayed scores in place (block_q = block_k = 2048 compiles for mamba2_ssd).
            return indivisible(dims, s) or over_vmem(vmem)

        return ScheduleSpace(attention_knobs("k, v and key-decay", "q, out, accumulator",
                                             kv_index_maps=("plain", "clamp")), check)

    def validate_config(self, config):
        validate_attention_config(self.name, config, ("batch", "num_heads", "seq_len", "head_dim", "d_state",
                                                      "d_model"), head_multiple=64)
