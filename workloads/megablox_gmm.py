"""11p megablox_gmm: the Qwen3-235B-A22B MoE grouped matmul (megablox), bf16.

Inputs (spec 11p): ``split(key(42), 2)`` -> lhs (M, K) ~ N(0,1) and rhs (G, K, N) ~
N(0,1)*0.02, bf16, with M = seq_len * num_experts_per_tok = 32768, K = emb_dim = 4096,
N = moe_mlp_dim = 1536, G = num_experts = 128; group_sizes (G,) int32. JAXBench's 4th
argument, the Python int max_expert_size (256 = M/G), is the config value
``max_expert_size`` here: a static bound on the largest group, not an input. Both
signatures are accepted: ``workload(lhs, rhs, group_sizes)`` (read ``CONFIG``) and
JAXBench's ``workload(lhs, rhs, group_sizes, max_expert_size)``, which is passed the int.

Math (the general rule, not only the shipped uniform sizes): group g owns the rows
[offset_g, offset_g + size_g), offset_g being the sum of the earlier groups' sizes;
out[those rows] = lhs[those rows] @ rhs[g], accumulated in f32 and cast to bf16; rows
past the groups' total are zero. Output (M, N) bf16, tolerance 1e-2/1e-2. The reference
is JAXBench's program op for op (a rolled ``lax.scan`` over groups, each multiplying a
static window of max_expert_size rows from the group's start in f32, masking the rows
outside the group and adding the window, in bf16, into an output padded by one window).
That is exact whenever max_expert_size * G <= M (the spec's and the check's configs). Only
for a larger bound, where a group can start within a window of the end of lhs and
JAXBench's clamped slice would read shifted rows, does the reference slide that window
back inside lhs and shift the mask with it. Group sizes must be at most max_expert_size.

Inputs beyond the spec: seed 0 is the spec's (every group M/G rows). Seeds >= 1 draw
ragged sizes, uniform in [0, min(max_expert_size, M/G)] with about a quarter of the
groups (at least one) empty, from ``fold_in(key(42 + seed), 2)``: their sum is at most M
and usually well below it, so the check exercises groups that start and end inside row
tiles, empty groups and zero rows past the total, not only the uniform layout. Their lhs is
structured (``base.structured_normal``: per-row and per-column means and scales, correlated
rows, outliers) and rhs has scales, low rank and outliers but no means (``WEIGHT_STRUCTURE``).

The check runs at num_experts=4, seq_len=512, num_experts_per_tok=2 (M=1024, 256 rows per
uniform group), emb_dim=1024, moe_mlp_dim=1536 (kept), max_expert_size=M/G: M, K and N
are multiples of the largest tm (512), tk (1024) and tn (1536) in the space, so every
schedule is checked with its own tiling. Four groups keep groups that straddle tiles.

Expert (``experts/megablox_gmm.py``): jax's megablox ``gmm`` with JAXBench's tiling
(256, 1024, 1024), output in bf16 (``preferred_element_type``; megablox defaults to f32),
and the rows past the groups' total zeroed after the call (megablox leaves them unwritten).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import (
    WEIGHT_STRUCTURE,
    Knob,
    ScheduleSpace,
    Workload,
    indivisible,
    matmul_vmem_bytes,
    over_vmem,
    require_positive_ints,
    seeded_normal,
)
from .essential import spec_arrays

BLOCKS_M = (128, 256, 512)
BLOCKS_K = (256, 512, 1024)
BLOCKS_N = (128, 256, 512, 768, 1536)
EMPTY_GROUP_FRACTION = 0.25


def rows(config) -> int:
    """M: one lhs row per (token, chosen expert)."""
    return config["seq_len"] * config["num_experts_per_tok"]


class MegabloxGMM(Workload):
    name = "megablox_gmm"
    jaxbench_id = "11p"
    category = "grouped matmul"
    description = "grouped matmul of 128 experts' row groups, lhs (32768,4096) x rhs (128,4096,1536), bf16"
    defaults = {"num_experts": 128, "num_experts_per_tok": 8, "emb_dim": 4096, "moe_mlp_dim": 1536,
                "seq_len": 4096, "max_expert_size": 256, "dtype": "bfloat16"}
    check_overrides = {"num_experts": 4, "num_experts_per_tok": 2, "seq_len": 512, "emb_dim": 2048,
                       "moe_mlp_dim": 1536}
    atol = 1e-2
    rtol = 1e-2
    template_file = "megablox_gmm.py"
    expert_file = "megablox_gmm.py"

    def jaxbench_signature(self, config):
        # JAXBench's workload(lhs, rhs, group_sizes, max_expert_size): the bound as a Python int
        return 4, lambda lhs, rhs, group_sizes: (lhs, rhs, group_sizes, config["max_expert_size"])

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("num_experts", "num_experts_per_tok", "emb_dim",
                                                  "moe_mlp_dim", "seq_len", "max_expert_size"))
        m, g = rows(config), config["num_experts"]
        if m % 128:
            raise ValueError(f"megablox_gmm: seq_len*num_experts_per_tok={m} must be a multiple of 128 (the smallest tm)")
        if m % g:
            raise ValueError(f"megablox_gmm: seq_len*num_experts_per_tok={m} must be a multiple of num_experts={g} "
                             "(seed 0's groups are uniform)")
        if not m // g <= config["max_expert_size"] <= m:
            raise ValueError(f"megablox_gmm: max_expert_size={config['max_expert_size']} must lie in "
                             f"[M/num_experts, M] = [{m // g}, {m}]")
        for key in ("emb_dim", "moe_mlp_dim"):
            if config[key] % 128:
                raise ValueError(f"megablox_gmm: {key}={config[key]} must be a multiple of 128 (the TPU lane width)")

    def check_config(self):
        out = super().check_config()
        out["max_expert_size"] = rows(out) // out["num_experts"]  # any bound >= the largest group is exact
        return out

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        m, k, n, g = rows(config), config["emb_dim"], config["moe_mlp_dim"], config["num_experts"]
        key = jax.random.key(42 + seed)
        k_lhs, k_rhs = jax.random.split(key, 2)
        lhs = seeded_normal(k_lhs, (m, k), dt, seed)
        rhs = seeded_normal(k_rhs, (g, k, n), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        if seed == 0:
            return lhs, rhs, jnp.full((g,), m // g, jnp.int32)
        k_size, k_empty, k_one = jax.random.split(jax.random.fold_in(key, 2), 3)
        cap = min(config["max_expert_size"], m // g)
        sizes = jax.random.randint(k_size, (g,), 0, cap + 1, jnp.int32)
        empty = jax.random.bernoulli(k_empty, EMPTY_GROUP_FRACTION, (g,))
        empty = empty.at[jax.random.randint(k_one, (), 0, g)].set(True)
        return lhs, rhs, jnp.where(empty, 0, sizes).astype(jnp.int32)

    def reference(self, config, lhs, rhs, group_sizes):
        # JAXBench's baseline op for op: offsets from a cumsum, an output padded by one
        # window, a rolled scan over groups, each a static window of rows multiplied in f32,
        # masked to the group's rows, added in bf16, and the padding cut at the end.
        window = config["max_expert_size"]
        m, k = lhs.shape
        g_count, n = rhs.shape[0], rhs.shape[2]
        # With window * G <= M every group (size <= window, sizes summing to <= M) starts at
        # most M - window rows in, so the lhs window never runs past lhs and JAXBench's ops
        # are exact (the spec's 256 * 128 = 32768 rows, and the check's window M/G). A
        # larger bound can put a group's start within a window of the end, where
        # dynamic_slice clamps and JAXBench's ops read shifted rows: there the window is
        # moved back inside lhs and the mask and write follow it.
        slide = window * g_count > m
        ends = jnp.cumsum(group_sizes)
        starts = jnp.concatenate([jnp.zeros(1, dtype=jnp.int32), ends[:-1]])
        padded = jnp.zeros((m + window, n), dtype=lhs.dtype)

        def one_group(out, g):
            start, size = starts[g], group_sizes[g]
            first = jnp.minimum(start, m - window) if slide else start
            x = jax.lax.dynamic_slice(lhs, (first, 0), (window, k))
            y = jax.lax.dot(x, rhs[g, :, :], preferred_element_type=jnp.float32)
            row = jax.lax.broadcasted_iota(jnp.int32, (window, n), 0)
            if slide:
                row = first + row
                keep = (row >= start) & (row < start + size)
            else:
                keep = row < size
            y = jnp.where(keep, y, 0.0)
            current = jax.lax.dynamic_slice(out, (first, 0), (window, n))
            return jax.lax.dynamic_update_slice(out, current + y.astype(out.dtype), (first, 0)), None

        # Rolled, as JAXBench's: the simulator prices the while body times its trip count.
        padded, _ = jax.lax.scan(one_group, padded, jnp.arange(g_count))
        return padded[:m, :]

    def essential_work(self, config):
        # Only the rows in a group are multiplied (the reference multiplies a max_expert_size
        # window per group): lhs rows in groups, rhs of non-empty groups, group_sizes, output.
        sizes = spec_arrays(self, config, lambda lhs, rhs, group_sizes: group_sizes).astype(np.int64)
        m, k, n = rows(config), config["emb_dim"], config["moe_mlp_dim"]
        in_groups = min(int(sizes.sum()), m)
        itemsize = self.dtype(config).itemsize
        nbytes = (in_groups * k + int((sizes > 0).sum()) * k * n + m * n) * itemsize + sizes.size * 4
        return float(nbytes), 2.0 * k * n * in_groups

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        dims = {"tm": ("M", rows(config)), "tk": ("emb_dim", config["emb_dim"]),
                "tn": ("moe_mlp_dim", config["moe_mlp_dim"])}

        def check(s):
            return indivisible(dims, s) or over_vmem(matmul_vmem_bytes(s["tm"], s["tk"], s["tn"], s["buffers"], dt))

        return ScheduleSpace(
            [
                Knob("tm", BLOCKS_M, 256, "lhs/out rows per work item (a tile spanning g groups is computed g times)"),
                Knob("tk", BLOCKS_K, 1024, "contraction depth per grid step"),
                Knob("tn", BLOCKS_N, 768, "rhs/out columns per grid step"),
                Knob("buffers", (1, 2), 2, "pipeline buffers for the lhs and rhs blocks (jax 0.10.2 lowers only 1 or 2)"),
            ],
            check,
        )
