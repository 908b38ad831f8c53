"""17p triangle_multiplication: AlphaFold2's outgoing triangle update (tokamax), bf16.

Inputs (spec 17p): ``split(key(42), 9)``: key 0 -> pair_act (N, N, C) ~ N(0,1); mask =
ones (N, N, 1) takes no key; keys 1..7 -> left_proj, right_proj, left_gate, right_gate
(C, C) ~ N(0,1)*0.02, center_scale (C,) ~ N(0,1)*0.1 + 1, out_proj, out_gate (C, C) ~
N(0,1)*0.02; key 8 is unused. All bf16, N = 1536, C = 128, direction "outgoing" (the only
one JAXBench has).

Math, all in bf16: a = pair_act * mask; L = (a @ left_proj) * sigmoid(a @ left_gate);
R = (a @ right_proj) * sigmoid(a @ right_gate); T[i, j, c] = sum_k L[i, k, c] R[j, k, c];
T = T / sqrt(mean_c T^2 + 1e-6) * center_scale (an RMS norm: no mean, no bias);
out = (T @ out_proj) * sigmoid(pair_act @ out_gate). Output (N, N, C) bf16, tolerance
1e-2/1e-2. The output's std is ~0.11 at both sizes, so most entries exceed the
tolerance's ~0.011 and a zero or constant output fails. The mask is all ones, as
JAXBench's, so at seed 0 a kernel that ignores it passes. The check's seeds (never 0) mask
padded residues (15%: their rows and columns) and 5% of the other pairs, draw pair_act
structured (per-pair and per-channel means and scales, correlated pairs, outliers) and the
projections with scales, low rank and outliers but no means (``WEIGHT_STRUCTURE``).

The template runs three kernels: a fused projection/gating that writes L and R
channel-major, the triangle contraction as a batched matmul over channels, and a fused
norm/output-projection/gating epilogue.

The check runs at N=256, C=128: the contraction is N^3 C and the projections N^2 C^2, so
N shrinks (C, the lane dimension, stays). N=256 is a multiple of every block in the space
but 512 (capped at N by the template). A block of 256 or 512 leaves its grid axis one step
at N=256 where the full size has several, so such schedules are checked at the next rung,
N=512, at ~8x the CPU time; the default's 128-blocks are checked at N=256 (for that, the
default: 256-blocks cost every reset a check of minutes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import (
    Knob,
    ScheduleSpace,
    WEIGHT_STRUCTURE,
    Workload,
    indivisible,
    over_vmem,
    require_positive_ints,
    seeded_normal,
    tile_bytes,
)

BLOCKS_C = (1, 2, 4, 8, 16)
BLOCKS_N = (128, 256, 512)
BLOCKS_ROWS = (512, 1024, 2048, 4096)


def triangle_vmem_bytes(s, channels: int, dt: str) -> int:
    """The template's VMEM, its largest kernel's. Triangle: pipelined (c, i, k) and (c, j, k)
    blocks, the double-buffered (c, i, j) output block, its f32 accumulator and one step's
    f32 product. Projection and epilogue: pipelined (rows, C) and (C, rows) blocks with ~6
    f32 (rows, C) temporaries (the 4C-wide projection, the transposes, the gates)."""
    bc, bi, bj, bk, buffers, br = (s["block_c"], s["block_i"], s["block_j"], s["block_k"], s["buffers"],
                                   s["block_rows"])
    triangle = (buffers * (tile_bytes((bc, bi, bk), dt) + tile_bytes((bc, bj, bk), dt))
                + 2 * tile_bytes((bc, bi, bj), dt) + 2 * tile_bytes((bc, bi, bj), "float32"))
    rowwise = (2 * buffers * tile_bytes((br, channels), dt) + 2 * tile_bytes((channels, br), dt)
               + 6 * tile_bytes((br, channels), "float32"))
    return max(triangle, rowwise)


class TriangleMultiplication(Workload):
    name = "triangle_multiplication"
    jaxbench_id = "17p"
    category = "pair/triangle"
    description = "AlphaFold2 outgoing triangle multiplication on a (1536,1536,128) pair tensor, bf16"
    defaults = {"N": 1536, "C": 128, "direction": "outgoing", "dtype": "bfloat16"}
    check_overrides = {"N": 256}
    atol = 1e-2
    rtol = 1e-2
    template_file = "triangle_multiplication.py"

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("N", "C"))
        if config["direction"] != "outgoing":
            raise ValueError(f"triangle_multiplication: direction {config['direction']!r} is not supported; "
                             "JAXBench's workload is 'outgoing'")
        if config["N"] % 128:
            raise ValueError(f"triangle_multiplication: N={config['N']} must be a multiple of 128 (the smallest block)")
        if config["C"] % 128:
            raise ValueError(f"triangle_multiplication: C={config['C']} must be a multiple of 128 (the TPU lane width)")

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        n, c = config["N"], config["C"]
        keys = jax.random.split(jax.random.key(42 + seed), 9)
        pair_act = seeded_normal(keys[0], (n, n, c), dt, seed)
        if seed == 0:
            mask = jnp.ones((n, n, 1), dt)
        else:  # padded residues (15%) mask their rows and columns, and 5% of the other pairs
            k_residue, k_pair = jax.random.split(keys[8], 2)
            valid = jax.random.bernoulli(k_residue, 0.85, (n,))
            mask = (valid[:, None] & valid[None, :] & jax.random.bernoulli(k_pair, 0.95, (n, n)))[..., None].astype(dt)
        left_proj, right_proj, left_gate, right_gate = (
            seeded_normal(keys[i], (c, c), dt, seed, scale=0.02, **WEIGHT_STRUCTURE) for i in (1, 2, 3, 4))
        center_scale = seeded_normal(keys[5], (c,), dt, seed, scale=0.1, offset=1.0)
        out_proj = seeded_normal(keys[6], (c, c), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        out_gate = seeded_normal(keys[7], (c, c), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        return pair_act, mask, left_proj, right_proj, left_gate, right_gate, center_scale, out_proj, out_gate

    def reference(self, config, pair_act, mask, left_proj, right_proj, left_gate, right_gate, center_scale,
                  out_proj, out_gate):
        act = pair_act * mask
        left = jnp.dot(act, left_proj) * jax.nn.sigmoid(jnp.dot(act, left_gate))
        right = jnp.dot(act, right_proj) * jax.nn.sigmoid(jnp.dot(act, right_gate))
        t = jnp.einsum("ikc,jkc->ijc", left, right)
        t = t / jnp.sqrt(jnp.mean(jnp.square(t), axis=-1, keepdims=True) + 1e-6) * center_scale
        return jnp.dot(t, out_proj) * jax.nn.sigmoid(jnp.dot(pair_act, out_gate))

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        n = config["N"]
        dims = {"block_c": ("C", config["C"]), "block_i": ("N", n), "block_j": ("N", n), "block_k": ("N", n),
                "block_rows": ("N*N", n * n)}

        def check(s):
            # The template caps blocks at the dimension (N, N*N), and so does the rule.
            capped = {**s, **{b: min(s[b], n) for b in ("block_i", "block_j", "block_k")},
                      "block_rows": min(s["block_rows"], n * n)}
            return indivisible(dims, capped) or over_vmem(triangle_vmem_bytes(capped, config["C"], dt))

        return ScheduleSpace(
            [
                Knob("block_rows", BLOCKS_ROWS, 2048, "pair rows (i, j) per step of the projection and epilogue kernels"),
                Knob("block_c", BLOCKS_C, 8, "channels per grid step (one batched matmul)"),
                Knob("block_i", BLOCKS_N, 128, "rows i of T per grid step"),
                Knob("block_j", BLOCKS_N, 128, "columns j of T per grid step"),
                Knob("block_k", BLOCKS_N, 128, "contraction depth k per grid step"),
                Knob("buffers", (1, 2), 2, "pipeline buffers for the streamed input blocks (jax 0.10.2 lowers only 1 or 2)"),
            ],
            check,
        )
