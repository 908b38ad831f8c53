"""The differentiable tier: the analytic model as a JAX function of continuous block sizes.

Each block-size knob (a knob whose values are powers of two, up to at least 64) is relaxed to
a continuous ``x = log2(block)``. The per-kernel quantities the full model prices (grid
steps, MXU flops, vector and transcendental work per step, pipelined and serial bytes, VMEM)
are read from traced jaxprs, no compile: at the start schedule and one neighbour per knob.
In log space each quantity is taken as linear in ``x`` (a power law in the block sizes, as
tiling makes them: steps ~ 1/(bm bk bn), flops per step ~ bm bk bn, bytes per fetch ~ the
block's area), its slope the finite difference between the two traces. The predicted time

    sum over kernels of  steps * model.step_s(compute, overlapped DMA, serial DMA per step)

with the fitted constants, plus a penalty for VMEM beyond the kernel's limit, is then a smooth
function of ``x``: gradient search descends it (DOSA-style), rounds to the nearest legal
values and lets the full simulator judge the result. Around the start schedule this is
exact to first order; far from it, a guide, not a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .hardware import V6E, Calibration, Chip, calibration
from .model import step_s
from .pallas import kernel_features, pallas_call_eqns, vmem_limit

QUANTITIES = ("steps", "flops", "vector_ops", "transcendentals", "overlapped_bytes", "serial_bytes", "vmem_bytes")
_TINY = 1e-30


def block_knobs(space) -> list:
    """The knobs relaxed to continuous log2 values: power-of-two block sizes."""
    return [k for k in space.knobs
            if all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in k.values)
            and len(k.values) > 1 and max(k.values) >= 64]


def kernel_quantities(jaxpr) -> tuple[np.ndarray, np.ndarray]:
    """(quantities per kernel [kernels, QUANTITIES], VMEM limit per kernel) of a traced program."""
    rows, limits = [], []
    for eqn in pallas_call_eqns(jaxpr):
        k = kernel_features(eqn)
        serial = sum(s * c for _, s, c in k.traffic)
        overlapped = sum(o * c for o, _, c in k.traffic)
        rows.append([k.steps, k.flops, k.vector_ops, k.transcendentals, overlapped, serial, k.vmem_bytes])
        limits.append(vmem_limit(eqn, V6E.scoped_vmem_bytes))
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(QUANTITIES)), np.asarray(limits, dtype=np.float64)


@dataclass
class RelaxedModel:
    """``time(x)``: predicted seconds as a smooth function of log2 block sizes ``x``."""

    knobs: list  # names of the relaxed knobs, in x's order
    lower: np.ndarray  # log2 of each knob's smallest and largest value
    upper: np.ndarray
    x0: np.ndarray  # log2 of the start schedule's values
    log_q0: np.ndarray  # [kernels, QUANTITIES] log quantities at x0
    slopes: np.ndarray  # [kernels, QUANTITIES, knobs] d log q / d x
    vmem_limits: np.ndarray  # [kernels]
    chip: Chip
    cal: Calibration

    def time(self, x):
        import jax.numpy as jnp

        q = jnp.exp(self.log_q0 + jnp.einsum("kqj,j->kq", self.slopes, x - self.x0))
        steps, flops, vec, trans, overlapped, serial, vmem = (q[:, i] for i in range(len(QUANTITIES)))
        bandwidth = self.chip.hbm_bytes_per_s * self.cal.hbm_efficiency
        compute = (flops / self.chip.mxu_flops_per_s + vec / self.cal.vector_ops_per_s
                   + trans / self.cal.transcendentals_per_s)
        # A kernel without single-buffered copies has none anywhere (its log quantity sits at the floor).
        serial = jnp.where(self.log_q0[:, QUANTITIES.index("serial_bytes")] > math.log(_TINY), serial, 0.0)
        per_step = step_s(compute, overlapped / steps / bandwidth, serial / steps / bandwidth,
                          self.cal.step_overhead_s, self.cal.overlap, xp=jnp)
        seconds = jnp.sum(steps * per_step)
        # Over VMEM the compiler refuses the kernel: a steep, smooth wall.
        over = jnp.maximum(jnp.log(vmem / self.vmem_limits), 0.0)
        return seconds * jnp.exp(8.0 * jnp.sum(over))

    def schedule(self, x, base: Mapping[str, Any], space) -> dict:
        """The legal schedule nearest to ``x`` (in log2), other knobs from ``base``."""
        out = dict(base)
        by_name = {k.name: k for k in space.knobs}
        for name, xi in zip(self.knobs, np.asarray(x)):
            values = by_name[name].values
            out[name] = min(values, key=lambda v: abs(math.log2(v) - float(xi)))
        return out


def build(workload, trace: Callable[[Mapping[str, Any]], Any], schedule: Mapping[str, Any], chip: Chip = V6E,
          cal: Calibration | None = None) -> RelaxedModel:
    """The relaxed model of a kernel around ``schedule``: one trace at it and one per knob.
    ``trace(schedule)`` returns the jaxpr of the kernel's module at that schedule (the
    caller decides whose code may run in its process)."""
    space = workload.schedule_space()
    knobs = block_knobs(space)
    if not knobs:
        raise ValueError(f"{workload.name}'s schedule space has no block-size knob to relax")
    q0, limits = kernel_quantities(trace(schedule))
    if not len(q0):
        raise ValueError("the source has no pallas_call to model")
    log_q0 = np.log(np.maximum(q0, _TINY))
    slopes = np.zeros(q0.shape + (len(knobs),))
    for j, knob in enumerate(knobs):
        here = knob.values.index(schedule[knob.name])
        for other in (here + 1, here - 1):  # a neighbour the space and the tracer accept
            if not 0 <= other < len(knob.values):
                continue
            moved = {**schedule, knob.name: knob.values[other]}
            if space.check(moved) is not None:
                continue
            try:
                q1, _ = kernel_quantities(trace(moved))
            except Exception:  # noqa: BLE001 - an untraceable neighbour: try the other side
                continue
            if q1.shape == q0.shape:
                dx = math.log2(knob.values[other]) - math.log2(schedule[knob.name])
                slopes[:, :, j] = (np.log(np.maximum(q1, _TINY)) - log_q0) / dx
                break
    return RelaxedModel(
        knobs=[k.name for k in knobs],
        lower=np.array([math.log2(min(k.values)) for k in knobs]),
        upper=np.array([math.log2(max(k.values)) for k in knobs]),
        x0=np.array([math.log2(schedule[k.name]) for k in knobs]),
        log_q0=log_q0, slopes=slopes, vmem_limits=limits, chip=chip, cal=cal or calibration(),
    )


def descend(model: RelaxedModel, x_start: np.ndarray, steps: int = 200, lr: float = 0.1) -> np.ndarray:
    """Adam on log time from ``x_start``, clipped to the knobs' ranges."""
    import jax
    import jax.numpy as jnp

    grad = jax.jit(jax.value_and_grad(lambda x: jnp.log(model.time(x))))
    x = jnp.asarray(x_start, dtype=jnp.float32)
    m = v = jnp.zeros_like(x)
    b1, b2 = 0.9, 0.999
    for t in range(1, steps + 1):
        _, g = grad(x)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + 1e-8)
        x = jnp.clip(x, model.lower, model.upper)
    return np.asarray(x)
