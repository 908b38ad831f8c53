"""8p gemm: the Llama-3.1-70B FFN matmul, C = A @ B.

Inputs (spec 8p): ``split(key(42), 2)`` -> A (M, K) ~ N(0,1), B (K, N) ~ N(0,1)*0.02, bf16.
The check's seeds (never 0) draw A structured (``base.structured_normal``: per-row and
per-column means and scales, correlated rows, outliers) and B with scales, low rank and
outliers but no means (``WEIGHT_STRUCTURE``), so C is not predictable from the inputs' moments.
The check runs at M=1024, K=1024, N=2048: multiples of jax's tuned expert blocks (bm=1024,
bk=1024, bn=2048), so a kernel tuned for the full size is checked with its own tiling (a
larger block climbs the check ladder, ``Workload.check_rungs``). Only the sizes shrink, not
the tiling.
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

BLOCKS_M = (128, 256, 512, 1024, 2048)
BLOCKS_K = (128, 256, 512, 1024)
BLOCKS_N = (128, 256, 512, 1024, 2048)
VMEM_LIMIT = 100 * 2**20  # the template's scoped VMEM limit (templates/gemm.py)


class Gemm(Workload):
    name = "gemm"
    jaxbench_id = "8p"
    category = "matmul"
    description = "C = A @ B, bf16, Llama-3.1-70B FFN shape"
    defaults = {"M": 8192, "K": 8192, "N": 28672, "dtype": "bfloat16"}
    check_overrides = {"M": 1024, "K": 1024, "N": 2048}
    template_file = "gemm.py"
    expert_file = "gemm.py"

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("M", "K", "N"))

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        ka, kb = jax.random.split(jax.random.key(42 + seed), 2)
        a = seeded_normal(ka, (config["M"], config["K"]), dt, seed)
        b = seeded_normal(kb, (config["K"], config["N"]), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        return a, b

    def reference(self, config, a, b):
        return a @ b

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))

        dims = {"block_m": ("M", config["M"]), "block_k": ("K", config["K"]), "block_n": ("N", config["N"])}

        def check(s):
            return indivisible(dims, s) or over_vmem(schedule_matmul_vmem(s, config["K"], dt), VMEM_LIMIT)

        return ScheduleSpace(
            [
                Knob("block_m", BLOCKS_M, 512, "rows of A and C per grid step"),
                Knob("block_k", BLOCKS_K, 1024, "contraction depth per grid step"),
                Knob("block_n", BLOCKS_N, 1024, "columns of B and C per grid step"),
                Knob("buffers", (1, 2), 2, "pipeline buffers for the A and B blocks (jax 0.10.2 lowers only 1 or 2)"),
                Knob("order", ("mn", "nm"), "mn", "which output axis the outer grid loop walks"),
                ACCUMULATOR,
            ],
            check,
            accumulator_inert,
        )
