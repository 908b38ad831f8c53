"""14p ragged_dot: the Mixtral-8x7B uniform grouped matmul (tokamax), bf16.

Inputs (spec 14p): ``split(key(42), 2)`` -> x (num_groups, M/num_groups, K) ~ N(0,1) and
weights (num_groups, K, N) ~ N(0,1)*0.02, bf16. Math: out[g] = x[g] @ weights[g]; there is
no group_sizes input (the groups are uniform). Output (num_groups, M/num_groups, N) bf16,
tolerance 1e-2/1e-2. The check's seeds (never 0) draw x structured (per-row and per-column
means and scales, correlated rows, outliers) and the weights with scales, low rank and
outliers but no means (``WEIGHT_STRUCTURE``); the spec has no group sizes to make ragged.

The template is a grouped matmul whose grid walks (group, row blocks, column blocks, K
blocks). The check runs at num_groups=2, M=2048 (1024 rows per group), K=1024, N=2048:
1024 rows per group, K=1024 and N=2048 are multiples of the largest block_m (1024),
block_k (1024) and block_n (2048) in the space, so every schedule is checked with its
own tiling. The group count shrinks to 2 (still more than one, so a kernel that indexes
the wrong group's weights fails), and ``check_config`` keeps the rows per group at
min(1024, M/num_groups) rather than shrinking M alone, so a config with few rows per group
is never checked with more. The output's std is ~0.64 at this size (~1.3 at full size).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import (
    ACCUMULATOR,
    accumulator_inert,
    WEIGHT_STRUCTURE,
    Knob,
    ScheduleSpace,
    Workload,
    indivisible,
    schedule_matmul_vmem,
    over_vmem,
    require_positive_ints,
    seeded_normal,
)

BLOCKS_MK = (128, 256, 512, 1024)
BLOCKS_N = (128, 256, 512, 1024, 2048)
VMEM_LIMIT = 100 * 2**20  # the template's scoped VMEM limit (templates/ragged_dot.py)
CHECK_GROUPS = 2
CHECK_ROWS_PER_GROUP = 1024


class RaggedDot(Workload):
    name = "ragged_dot"
    jaxbench_id = "14p"
    category = "grouped matmul"
    description = "uniform grouped matmul out[g] = x[g] @ weights[g], bf16, Mixtral-8x7B shape"
    defaults = {"num_groups": 8, "M": 8192, "K": 4096, "N": 14336, "dtype": "bfloat16"}
    check_overrides = {"num_groups": CHECK_GROUPS, "M": CHECK_GROUPS * CHECK_ROWS_PER_GROUP, "K": 1024, "N": 2048}
    atol = 1e-2
    rtol = 1e-2
    template_file = "ragged_dot.py"

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("num_groups", "M", "K", "N"))
        if config["M"] % config["num_groups"]:
            raise ValueError(f"ragged_dot: M={config['M']} must be a multiple of num_groups={config['num_groups']}")
        for key in ("K", "N"):
            if config[key] % 128:
                raise ValueError(f"ragged_dot: {key}={config[key]} must be a multiple of 128 (the TPU lane width)")
        if (config["M"] // config["num_groups"]) % 128:
            raise ValueError("ragged_dot: M/num_groups must be a multiple of 128 (the smallest row block)")

    def check_config(self):
        out = super().check_config()
        rows = min(CHECK_ROWS_PER_GROUP, self.config["M"] // self.config["num_groups"])
        out["M"] = out["num_groups"] * rows
        return out

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        g = config["num_groups"]
        kx, kw = jax.random.split(jax.random.key(42 + seed), 2)
        x = seeded_normal(kx, (g, config["M"] // g, config["K"]), dt, seed)
        weights = seeded_normal(kw, (g, config["K"], config["N"]), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        return x, weights

    def reference(self, config, x, weights):
        return jnp.einsum("gmk,gkn->gmn", x, weights)

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        dims = {"block_m": ("M/num_groups", config["M"] // config["num_groups"]),
                "block_k": ("K", config["K"]), "block_n": ("N", config["N"])}

        def check(s):  # as gemm's estimate
            return indivisible(dims, s) or over_vmem(schedule_matmul_vmem(s, config["K"], dt), VMEM_LIMIT)

        return ScheduleSpace(
            [
                Knob("block_m", BLOCKS_MK, 512, "rows of a group's x and out per grid step"),
                Knob("block_k", BLOCKS_MK, 1024, "contraction depth per grid step"),
                Knob("block_n", BLOCKS_N, 1024, "columns of a group's weights and out per grid step"),
                Knob("buffers", (1, 2), 2, "pipeline buffers for the x and weight blocks (jax 0.10.2 lowers only 1 or 2)"),
                ACCUMULATOR,
            ],
            check,
            accumulator_inert,
        )
