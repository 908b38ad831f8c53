"""Predicted v6e time of a compiled program: features from the compile, then a price.

``program_features`` reads what the compile produced, once, and nothing else (no jaxpr, no
candidate code): every op of the compiled HLO (its HBM bytes with layout padding,
``hlo.py``) with the bundles the compiler scheduled for it (``bundles.py``), and each Pallas
kernel step by step from the Mosaic module inside its ``tpu_custom_call`` (``mosaic.py``).
``price`` turns features into seconds with the chip and the fitted constants, cheaply, so a
fit re-prices stored features without compiling again:

- an XLA op (fusion, copy, compiler-generated kernel) costs
  ``overhead + combine(bundles / clock, HBM bytes / bandwidth)``, its compute never under its
  matmuls' FLOPs at the MXU peak; the Mosaic kernels the compiler writes itself (online
  softmax) at a bandwidth of their own;
- a Pallas kernel costs, per grid step, ``combine(compute, max(overlapped DMA, latency))``
  plus its serial DMA, itself at least the latency (``step_s``; a step that issues n groups
  of copies itself, n latencies), plus the unhidden first fetch and last write-back and the bundles
  outside its grid loop; compute is the kernel's bundles at that step where they can be
  read (its loops counted by the iterations they run at that step, its branches by the
  side that runs: ``mosaic.step_bundles``), else its body's MXU, vector and
  transcendental work at peak rates (on average per step).

``combine(c, m) = (c**p + m**p)**(1/p)`` with the fitted ``overlap`` p.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from . import bundles as bundle_dumps
from . import hlo, mosaic
from .hardware import V6E, Calibration, Chip, calibration
from .pallas import KernelFeatures

# Bump when what ``program_features`` extracts, or how ``price`` reads it, changes: cached results then miss.
FEATURES_VERSION = 10


@dataclass
class OpFeatures:
    name: str
    opcode: str
    hbm_bytes: float
    times: int
    bundles: float | None  # dynamic bundles of one run, None where the dump had none
    estimated_cycles: float | None
    generated: bool = False  # a Mosaic kernel the compiler wrote (online softmax): its own bandwidth
    flops: float = 0.0  # floating-point matmul/convolution FLOPs of one run


@dataclass
class ProgramFeatures:
    ops: list  # OpFeatures of the XLA ops (everything but the Pallas kernels)
    kernels: list  # KernelFeatures
    optimal_seconds: float | None  # the compiler's own estimate, for comparison
    notes: list = field(default_factory=list)
    unknown_trips: list = field(default_factory=list)  # XLA while loops priced once (trip count unknown)
    conditionals: list = field(default_factory=list)  # XLA conditionals priced at every branch

    def to_dict(self) -> dict:
        return {"ops": [asdict(o) for o in self.ops], "kernels": [k.to_dict() for k in self.kernels],
                "optimal_seconds": self.optimal_seconds, "notes": list(self.notes),
                "unknown_trips": list(self.unknown_trips), "conditionals": list(self.conditionals)}

    @classmethod
    def from_dict(cls, d: dict) -> "ProgramFeatures":
        return cls([OpFeatures(**o) for o in d["ops"]],
                   [KernelFeatures(**{**k, "grid": tuple(k["grid"]), "out_shapes": tuple(map(tuple, k["out_shapes"]))})
                    for k in d["kernels"]],
                   d.get("optimal_seconds"), list(d.get("notes", [])), list(d.get("unknown_trips", [])),
                   list(d.get("conditionals", [])))


@dataclass
class SimBreakdown:
    time_s: float
    kernels: list  # per kernel: name, steps, time_s, compute_s, dma_s, source of compute
    glue_s: float
    optimal_seconds: float | None
    constants: str  # the calibration version used
    notes: list
    features: ProgramFeatures

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "glue_s": self.glue_s, "kernels": self.kernels,
                "optimal_seconds": self.optimal_seconds, "calibration": self.constants, "notes": self.notes,
                "features": self.features.to_dict()}


def _optimal_seconds(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    value = (cost or {}).get("optimal_seconds")
    return float(value) if value is not None else None


def program_features(compiled, profiles: dict | None = None, prefetch: list | None = None,
                     unseen: list | None = None) -> ProgramFeatures:
    """Features of a compiled program (``compiled``: what ``.compile()`` returned), read from
    its HLO and its kernels' Mosaic modules alone.

    ``profiles``: bundle profiles by HLO op name (``bundles.collect()`` right after the
    compile); without them compute falls back to the analytic estimates. ``prefetch``: one
    entry per ``tpu_custom_call`` of the compiled HLO, in the order
    ``mosaic.hlo_custom_calls(compiled.as_text())`` lists them: the concrete values of the
    call's leading operands (dynamic grid bounds, then scalar-prefetch tables; ``[]`` for a
    kernel without any) or None (upper bounds, and a fresh block every step for index maps
    that read tables); or None for all. Values listed in the exported program's order
    (``prefetch.prefetch_tables``) are put in this order with ``mosaic.match_calls``: the
    compiler may add Mosaic kernels of its own (entries None) and order kernels its way.
    ``unseen``: in the same order, what no check saw each kernel do (``mosaic.Unseen``; None:
    nothing), priced at a bound.
    """
    text = compiled.as_text()
    program = hlo.program_ops(text)
    ops, notes = program.ops, program.notes
    calls = mosaic.hlo_custom_calls(text)
    if prefetch is not None and len(prefetch) != len(calls):
        raise ValueError(f"{len(prefetch)} prefetch entries for the compiled program's {len(calls)} "
                         "tpu_custom_calls (put them in its order with mosaic.match_calls)")
    by_name = {op.name: op for op in ops}
    profiles = profiles or {}
    kernels, kernel_ops = [], []
    for i, call in enumerate(calls):
        if not call.pallas:  # the compiler's own Mosaic kernel: an XLA op like any other
            continue
        op = by_name.get(call.name)
        profile = profiles.get(op.name) if op is not None else None
        kernels.append(mosaic.kernel_features(call, prefetch[i] if prefetch is not None else None, profile,
                                              (unseen[i] if unseen is not None else None) or mosaic.Unseen()))
        kernel_ops.append(op)
    if any(op is None for op in kernel_ops):
        notes.append("some kernels are outside the ops the program runs at top level or in its loops: "
                     "priced as running once")
    return _features(compiled, program, kernels, kernel_ops, profiles)


def _features(compiled, program: hlo.HloProgram, kernels: list[KernelFeatures], kernel_ops: list,
              profiles: dict) -> ProgramFeatures:
    """Program features from its ops and its kernels (each with its op in ``program.ops``, or None)."""
    ops, notes = program.ops, program.notes
    for k, op in zip(kernels, kernel_ops):
        k.times = op.times if op is not None else 1
        for note in k.notes:
            if note not in notes:
                notes.append(note)
    if any(k.bundles_per_step is None for k in kernels):
        notes.append("kernel compute from the analytic estimate (no readable bundles)")
    taken = {op.name for op in kernel_ops if op is not None}
    xla_ops = []
    for op in ops:
        if op.name in taken:
            continue
        profile = profiles.get(op.name)
        xla_ops.append(OpFeatures(op.name, op.opcode, op.hbm_bytes, op.times,
                                  profile.dynamic if profile is not None else None, op.estimated_cycles,
                                  op.generated, op.flops))
    if any(o.bundles is None and o.hbm_bytes > 0 for o in xla_ops if not o.opcode.endswith("-start")):
        notes.append("XLA ops without readable bundles priced from the compiler's cycle estimate or traffic")
    if any(k.dynamic_index for k in kernels):
        notes.append("index maps that could not be evaluated (scalar-prefetch tables without concrete values) "
                     "priced as a fresh block every step")
    if any(k.manual_dma for k in kernels):
        notes.append("hand-issued DMAs (dma_start) priced as overlapped with compute")
    bounds = sorted({k.grid_bound for k in kernels if k.grid_bound is not None})
    if bounds:
        notes.append(f"data-dependent grid axes priced at an upper bound ({', '.join(map(str, bounds))} steps): "
                     "an over-estimate")
    return ProgramFeatures(xla_ops, kernels, _optimal_seconds(compiled), notes, list(program.unknown_trips),
                           list(program.conditionals))


def combine(compute_s, memory_s, overlap: float, xp=np):
    """Time of work whose compute and memory traffic overlap to the degree ``overlap``.
    Elementwise over arrays; ``xp``: the array module (``jax.numpy`` for the relaxed tier)."""
    hi = xp.maximum(compute_s, memory_s)
    safe = xp.where(hi > 0, hi, 1.0)
    return xp.where(hi > 0, safe * ((compute_s / safe) ** overlap + (memory_s / safe) ** overlap) ** (1.0 / overlap),
                    0.0)


def step_s(compute_s, overlapped_s, serial_s, latency_s: float, overlap: float, xp=np, serial_latency_s=None):
    """One grid step. A step's copies take at least a fixed issue-to-completion latency,
    however few their bytes; double-buffered copies run during the step's compute, so a
    short step costs that latency whatever its bundles. Single-buffered copies, and copies
    waited for as soon as they start, wait in line (``serial_latency_s``: their latency, by
    default ``latency_s``). Elementwise, as ``combine``."""
    serial = serial_s > 0
    in_line = latency_s if serial_latency_s is None else serial_latency_s
    memory_s = xp.where(serial, overlapped_s, xp.maximum(overlapped_s, latency_s))
    return combine(compute_s, memory_s, overlap, xp) + xp.where(serial, xp.maximum(serial_s, in_line), 0.0)


def price_op(op: OpFeatures, chip: Chip, cal: Calibration) -> float:
    bandwidth = chip.hbm_bytes_per_s * (cal.generated_kernel_efficiency if op.generated else cal.hbm_efficiency)
    cycles = op.bundles if op.bundles is not None else (op.estimated_cycles or 0.0)
    # As for kernels: the fitted clock is an effective one, and no op's matmuls beat the MXUs' peak.
    compute_s = max(cycles / cal.bundle_rate_hz, op.flops / chip.mxu_flops_per_s)
    return op.times * (cal.op_overhead_s + float(combine(compute_s, op.hbm_bytes / bandwidth, cal.overlap)))


def price_kernel(k: KernelFeatures, chip: Chip, cal: Calibration) -> dict:
    bandwidth = chip.hbm_bytes_per_s * cal.hbm_efficiency
    overlapped, serial, counts = np.asarray(k.traffic, dtype=np.float64).reshape(-1, 3).T  # one row per kind of step
    if k.bundles_per_step is not None:
        per_row = k.row_bundles if k.row_bundles is not None else [k.bundles_per_step] * len(counts)
        computes = np.asarray(per_row, dtype=np.float64) / cal.bundle_rate_hz
        # The fitted clock is an effective one: no kernel's matmuls run faster than the MXUs' peak.
        mxu_s = k.flops * k.steps / chip.mxu_flops_per_s
        bundle_s = float(np.sum(counts * computes))
        if bundle_s > 0 and mxu_s > bundle_s:
            computes = computes * (mxu_s / bundle_s)
        source = "bundles"
    else:
        compute = (k.flops / chip.mxu_flops_per_s + k.vector_ops / cal.vector_ops_per_s
                   + k.transcendentals / cal.transcendentals_per_s)
        computes = np.full(len(counts), compute)
        source = "analytic"
    # Each group of copies the body issues itself waits out the copy latency, as a grid step's do.
    groups = k.row_dma_groups if k.row_dma_groups is not None else 0.0
    latency = cal.step_overhead_s * np.maximum(1.0, np.asarray(groups, np.float64))
    waited = k.row_waited_groups if k.row_waited_groups is not None else 0.0
    in_line = cal.step_overhead_s * np.maximum(1.0, np.asarray(waited, np.float64))
    steps_s = float(np.sum(counts * step_s(computes, overlapped / bandwidth, serial / bandwidth, latency,
                                           cal.overlap, serial_latency_s=in_line)))
    compute_s = float(np.sum(counts * computes))
    time_s = (cal.op_overhead_s + steps_s + (k.fill_bytes + k.drain_bytes) / bandwidth
              + k.bundles_outside / cal.bundle_rate_hz)
    return {"name": k.name, "grid": list(k.grid), "steps": k.steps, "times": k.times, "time_s": k.times * time_s,
            "compute_s": k.times * compute_s, "dma_s": k.times * k.hbm_bytes / bandwidth,
            "hbm_bytes": k.times * k.hbm_bytes, "vmem_bytes": k.vmem_bytes, "compute_from": source}


def price(features: ProgramFeatures, chip: Chip = V6E, cal: Calibration | None = None) -> SimBreakdown:
    cal = cal or calibration()
    kernels = [price_kernel(k, chip, cal) for k in features.kernels]
    glue_s = sum(price_op(op, chip, cal) for op in features.ops)
    return SimBreakdown(sum(k["time_s"] for k in kernels) + glue_s, kernels, glue_s, features.optimal_seconds,
                        cal.version, list(features.notes), features)


def predict_program(compiled, chip: Chip = V6E, profiles: dict | None = None,
                    prefetch: list | None = None, unseen: list | None = None) -> SimBreakdown:
    """Predicted v6e seconds of a compiled program (bundles collected if dumped); ``prefetch``
    and ``unseen`` as for ``program_features``."""
    if profiles is None:
        profiles = bundle_dumps.collect()
    return price(program_features(compiled, profiles, prefetch, unseen), chip)
