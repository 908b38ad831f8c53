"""The KernelBench matmul family: one tiled matmul, each workload states its epilogue.

A workload of this family declares its inputs (``params``), its JAX reference, and a
short template part: an ``epilogue`` on f32 tiles and the ``workload(*inputs)`` glue that
calls the family kernel ``fused_matmul`` (``templates/matmul_family.py``). The rendered
template is the family code, the workload's SCHEDULE and that part, one standalone
module an agent can edit.

Epilogues that need whole rows (softmax, row reductions, a norm over all features) set
``whole_rows``: their space has no block_n, the kernel keeps N whole.

Inputs: each param's ``init`` and key as the spec draws them at seed 0; the check's seeds
draw them structured (``kernelbench``'s shared rules): x (and 26k's y) structured around
U[0,1)'s mean, weights with scales, low rank and outliers but no means, biases (normal
params without a fan-in) at ``kernelbench.BIAS_SCALE``, and the constant ones and zeros
(norm weights and biases, running means and variances) drawn around 1 and 0.

Check size: M and the contraction shrink (512 rows, K=1024), N keeps its full size, so
row reductions, softmax and group norms see full-length rows. Weights are rescaled by
sqrt(K_full / K) (``kernelbench.fan_in_scale``) so activations keep their full-size spread.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jax

from . import kernelbench as kb
from .base import (
    ACCUMULATOR,
    accumulator_inert,
    Knob,
    ScheduleSpace,
    indivisible,
    schedule_matmul_vmem,
    over_vmem,
    tile_bytes,
)

# The row sum after a matmul, folded into the weights (the workloads whose math allows it).
FOLD = Knob("fold", ("none", "weights"), "none",
            "'weights': the row sum after the matmul computed as x @ (w summed over its output columns): "
            "N times fewer FLOPs, exact up to rounding")
# How x's row panel reaches VMEM, where column tiles share it (templates' ``x_input``).
X_PANEL = Knob("x_panel", ("pipelined", "prefetched"), "pipelined",
               "'pipelined': the Pallas pipeline fetches a new (block_m, K) panel of x during the one step "
               "before it is used; 'prefetched': copied by hand a chunk per column step during the panel "
               "before, so the panel change waits for nothing (all of K in one step; the grid runs in order)")
BLOCKS_M = (128, 256, 512, 1024, 2048)
BLOCKS_K = (256, 512, 1024, 2048)
BLOCKS_N = (256, 512, 1024, 2048)
VMEM_LIMIT = 100 * 2**20  # the template's scoped VMEM limit (templates/matmul_family.py)
CHECK_ROWS, CHECK_DEPTH = 512, 1024


@dataclass(frozen=True)
class Param:
    """One input: its shape (config keys or literal ints), how it is drawn, and its key.

    init: "uniform" U[0,1); "normal" N*scale (0.02 as the spec draws weights); "unit" N(0,1)
    unscaled; "ones"; "zeros". A normal or unit param with a ``fan_in`` is a weight, one
    without a bias (what the check's seeds draw for each: ``kernelbench``).
    Random params sharing a base key take ``split(key(base + seed), n)`` in declaration
    order (the key itself when n = 1). ``fan_in`` names a weight's contraction key.
    """

    name: str
    shape: tuple
    init: str = "normal"
    key: int = kb.KB
    fan_in: str | None = None
    scale: float = 0.02


def x_param(m="batch_size", k="in_features", key=kb.K0):
    return Param("x", (m, k), "uniform", key)


def weight(shape, fan_in, init="normal", key=kb.KB):
    return Param("w", shape, init, key, fan_in)


class MatmulWorkload(kb.KernelBenchWorkload):
    """Base of the matmul-family workloads; subclasses set the attributes below."""

    category = "matmul+epilogue"
    template_file = "matmul_family.py"
    params: tuple[Param, ...] = ()
    m_key, k_key, n_key = "batch_size", "in_features", "out_features"
    whole_rows = False  # the epilogue needs whole rows: block_n = N
    group_key: str | None = None  # config key of a group count, for epilogues that norm groups of columns
    template_part = ""  # the workload's epilogue(s) and workload(*inputs), template source
    extra_knobs: tuple[Knob, ...] = ()  # structural choices its template part reads from SCHEDULE
    # A whole-row epilogue the kernel can carry across N tiles (a row reduction, or a row map
    # after one: ``row_mapped_matmul``): the space gets block_n back, whole rows (block_n = N)
    # by default.
    online_rows = False

    @property
    def check_overrides(self):
        return {self.m_key: CHECK_ROWS, self.k_key: CHECK_DEPTH}

    extra_dims: tuple[str, ...] = ()  # further config keys that must be positive ints

    @property
    def dims(self):
        return (self.m_key, self.k_key, self.n_key, *filter(None, (self.group_key,)), *self.extra_dims)

    # --- inputs -------------------------------------------------------------------------
    def make_inputs(self, config, seed):
        dt = self.dt(config)
        groups: dict[int, list[Param]] = {}
        for p in self.params:
            if p.init in ("uniform", "normal", "unit"):
                groups.setdefault(p.key, []).append(p)
        key_of = {}
        for base, members in groups.items():
            ks = kb.keys(base, len(members), seed) if len(members) > 1 else [jax.random.key(base + seed)]
            key_of.update({p.name: k for p, k in zip(members, ks)})
        return tuple(self._draw(p, config, dt, key_of.get(p.name), seed) for p in self.params)

    def _draw(self, p: Param, config, dt, key, seed):
        shape = tuple(config[d] if isinstance(d, str) else d for d in p.shape)
        if p.init == "uniform":
            return kb.uniform(key, shape, dt, seed)
        if p.init in ("ones", "zeros"):
            return kb.constant(p.init, shape, dt, seed, kb.side_key(p.key, seed, p.name) if seed else None)
        scale = p.scale if p.init == "normal" else 1.0
        if not p.fan_in:
            return kb.bias(key, shape, dt, seed, scale)
        return kb.normal(key, shape, dt, scale * kb.fan_in_scale(config, self.defaults, p.fan_in), seed)

    def validate_shapes(self, config):
        if self.group_key and config[self.n_key] % config[self.group_key]:
            raise ValueError(f"{self.name}: {self.group_key}={config[self.group_key]} must divide "
                             f"{self.n_key}={config[self.n_key]}")

    # --- template ---------------------------------------------------------------------------
    def template_source(self) -> str:
        family = (Path(__file__).parent / "templates" / self.template_file).read_text()
        schedule = self.schedule_space().default()
        return (f"{family}\n\n# --- {self.name} ({self.jaxbench_id}) ---\n\nSCHEDULE = {schedule!r}\n\n\n"
                + textwrap.dedent(self.template_part).strip() + "\n")

    def folded_columns(self, config) -> int:
        """Output columns of the matmul the ``fold`` knob's variant computes: 1 where a row
        sum is folded into the weights (``FOLD``)."""
        return 1

    def group_size(self, config) -> int | None:
        return config[self.n_key] // config[self.group_key] if self.group_key else None

    def _schedule_space(self, config: Mapping[str, Any]) -> ScheduleSpace:
        dt = config["dtype"]
        m, k, n = config[self.m_key], config[self.k_key], config[self.n_key]
        group = self.group_size(config)

        def check(s):
            # A folded variant's kernel is a matmul as wide as the fold leaves the output.
            bn = self.folded_columns(config) if s.get("fold", "none") != "none" else s.get("block_n", n)
            dims = {"block_m": (self.m_key, m), "block_k": (self.k_key, k)}
            if "block_n" in s:
                dims["block_n"] = (self.n_key, n)
            if group and "block_n" in s and bn % group:
                return f"block_n={bn} splits the groups of {group} columns"
            if s.get("x_panel", "pipelined") != "pipelined" and s.get("accumulator") != "none":
                return "x_panel=prefetched needs all of K in one step (accumulator=none)"
            # The epilogue's f32 temporaries: about three tiles (e.g. softmax's exp and sum).
            need = schedule_matmul_vmem(s, k, dt, bn) + 3 * tile_bytes((s["block_m"], bn), "float32")
            return indivisible(dims, s) or over_vmem(need, VMEM_LIMIT)

        knobs = [Knob("block_m", BLOCKS_M, 128 if self.whole_rows else 512, "rows of x and of the output per grid step"),
                 Knob("block_k", BLOCKS_K, 512 if self.whole_rows else 1024, "contraction depth per grid step")]
        if not self.whole_rows:
            knobs.append(Knob("block_n", BLOCKS_N, 1024, "output columns per grid step"))
        elif self.online_rows:
            knobs.append(Knob("block_n", tuple(sorted({*BLOCKS_N, n})), n,
                              f"output columns per grid step: {n} keeps whole rows, fewer carries the row "
                              "reduction across tiles"))
        knobs += [Knob("buffers", (1, 2), 2, "pipeline buffers for the x and w blocks"), ACCUMULATOR,
                  *self.extra_knobs]
        if not self.whole_rows or self.online_rows:  # column tiles share x's row panel
            knobs.append(X_PANEL)
        return ScheduleSpace(knobs, check, accumulator_inert)
