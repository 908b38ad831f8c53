"""Analytic v6e time of a traced program: Pallas kernels step by step, XLA glue by roofline.

A ``pallas_call`` runs its grid in order. At each step the pipeline fetches the input
blocks whose block index changed since the previous step and writes back output blocks
whose index is about to change; with two or more buffers that traffic overlaps the
step's compute, with one it does not. A step costs
``max(overlapped DMA, compute) + serial DMA + fixed overhead``; the first step's fetch and
the last write-back are not hidden (pipeline fill and drain).

Compute per step comes from the kernel body's jaxpr: MXU flops of ``dot_general``,
elementwise work on the vector unit, transcendentals on the EUP. Both branches of a
``cond`` (``pl.when``) are counted: an over-estimate for kernels that skip work. Operands
left in HBM (``pl.ANY``) are not pipelined; the copies a body issues itself
(``dma_start``) are priced by the bytes of their destination, overlapped with compute.

Everything outside Pallas kernels is priced from the compiled program's cost analysis
as one roofline: max(flops / MXU peak, bytes / HBM bandwidth) + transcendentals / EUP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .hardware import V6E, Chip

_TRANSCENDENTAL = {"exp", "exp2", "log", "log1p", "tanh", "logistic", "rsqrt", "sqrt", "sin", "cos", "erf", "pow", "expm1", "erf_inv", "atan2"}
_FREE = {"program_id", "num_programs", "get", "swap", "load", "store", "masked_load", "masked_swap",
         "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "convert_element_type", "iota", "pjit",
         "closed_call", "cond", "while", "scan", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait"}


@dataclass
class KernelEstimate:
    name: str
    grid: tuple
    steps: int
    hbm_bytes: float
    mxu_flops: float
    compute_s: float
    dma_s: float
    time_s: float
    vmem_bytes: int


@dataclass
class SimBreakdown:
    time_s: float
    kernels: list = field(default_factory=list)
    glue_s: float = 0.0
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "time_s": self.time_s,
            "glue_s": self.glue_s,
            "kernels": [k.__dict__ for k in self.kernels],
            "notes": self.notes,
        }


def pallas_call_eqns(jaxpr):
    """Every pallas_call equation in a jaxpr, looking inside nested jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for sub in _subjaxprs(eqn):
            found.extend(pallas_call_eqns(sub))
    return found


def _subjaxprs(eqn):
    for p in eqn.params.values():
        for item in p if isinstance(p, (tuple, list)) else (p,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def _block_elems(bm) -> int:
    return math.prod(int(d) for d in bm.block_aval.shape) if bm.block_aval.shape else 1


def _buffers(bm) -> int:
    mode = getattr(bm, "pipeline_mode", None)
    return int(getattr(mode, "buffer_count", 2) or 2) if mode is not None else 2


def _itemsize(dtype) -> int | None:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # a semaphore, not data
        return None


def _scratch_bytes(gm) -> int:
    total = 0
    for aval in gm.scratch_avals:
        inner = getattr(aval, "inner_aval", aval)
        shape, dtype = getattr(inner, "shape", None), getattr(inner, "dtype", None)
        if shape is not None and dtype is not None and _itemsize(dtype):
            total += math.prod(shape) * _itemsize(dtype)
    return total


def _pipelined(bm) -> bool:
    """False for an operand left in HBM (memory_space=pl.ANY): the kernel copies from it
    by hand, so the pipeline neither fetches it nor gives it VMEM."""
    space = getattr(bm.transformed_block_aval, "memory_space", None)
    return str(space).lower().rsplit(".", 1)[-1] not in ("any", "hbm")


def vmem_estimate(eqn) -> int:
    """Bytes of VMEM a pallas_call's pipelined blocks and scratch need (no layout padding)."""
    gm = eqn.params["grid_mapping"]
    blocks = sum(_buffers(bm) * _block_elems(bm) * np.dtype(bm.array_aval.dtype).itemsize
                 for bm in gm.block_mappings if _pipelined(bm))
    return blocks + _scratch_bytes(gm)


def vmem_limit(eqn, chip: Chip = V6E) -> int:
    params = eqn.params.get("compiler_params")
    limit = getattr(params, "vmem_limit_bytes", None)
    if limit is None and isinstance(params, dict):
        limit = getattr(params.get("mosaic"), "vmem_limit_bytes", None)
    return int(limit or chip.scoped_vmem_bytes)


def _dma_bytes(eqn) -> float:
    """Bytes one ``dma_start`` copies: its destination's (sliced) shape."""
    import jax

    dst = jax.tree_util.tree_unflatten(eqn.params["tree"], eqn.invars)[1]
    ref, transforms = (dst.ref, dst.transforms) if hasattr(dst, "transforms") else (dst, ())
    aval = getattr(ref, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    for t in transforms:  # the last indexer's shape is what is copied
        if hasattr(t, "get_indexer_shape"):
            shape = t.get_indexer_shape()
    if shape is None or dtype is None or not _itemsize(dtype):
        return 0.0
    return float(math.prod(shape) * _itemsize(dtype))


def _body_costs(jaxpr, chip: Chip) -> tuple[float, float, float]:
    """(MXU flops, compute seconds, bytes of hand-issued DMAs) of one run of a kernel body.

    A ``scan`` (a fori_loop with static bounds) counts ``length`` times; a ``while`` loop,
    whose trip count the jaxpr does not say, once.
    """
    flops = vec = trans = dma = 0.0
    stack = [(jaxpr, 1.0)]
    while stack:
        j, times = stack.pop()
        for eqn in j.eqns:
            name = eqn.primitive.name
            inner = times * (eqn.params.get("length", 1) if name == "scan" else 1)
            stack.extend((sub, inner) for sub in _subjaxprs(eqn))
            out_elems = times * sum(math.prod(getattr(v.aval, "shape", ()) or (1,)) for v in eqn.outvars)
            if name == "dot_general":
                (lc, _), _ = eqn.params["dimension_numbers"]
                lhs_shape = eqn.invars[0].aval.shape
                flops += 2.0 * out_elems * math.prod(lhs_shape[d] for d in lc)
            elif name == "dma_start":
                dma += times * _dma_bytes(eqn)
            elif name in _TRANSCENDENTAL:
                trans += out_elems
            elif name not in _FREE:
                vec += out_elems
    compute = flops / chip.mxu_flops_per_s + vec / chip.vector_elems_per_s + trans / chip.transcendentals_per_s
    return flops, compute, dma


def _block_indices(bm, grid_points: np.ndarray, n_index_operands: int) -> np.ndarray | None:
    """Block index of this mapping at every grid step, shape (steps, ndim); None if data-dependent."""
    import jax

    closed = bm.index_map_jaxpr
    if n_index_operands or len(closed.jaxpr.invars) != grid_points.shape[1]:
        return None
    fn = jax.vmap(lambda *ids: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *ids))
    outs = jax.jit(fn)(*[grid_points[:, i].astype(np.int32) for i in range(grid_points.shape[1])])
    return np.stack([np.broadcast_to(np.asarray(o), (grid_points.shape[0],)) for o in outs], axis=1)


def static_grid(eqn) -> tuple[tuple[int, ...], int | None]:
    """The kernel's grid, with each data-dependent axis replaced by an upper bound: the
    longest 1-D scalar-prefetch table (a schedule table has an entry per grid step, as in
    megablox's). Returns (grid, the bound used or None)."""
    gm = eqn.params["grid_mapping"]
    if not gm.num_dynamic_grid_bounds:
        return tuple(int(g) for g in gm.grid), None
    first = gm.num_dynamic_grid_bounds
    tables = eqn.invars[first:first + gm.num_index_operands]
    bound = max((v.aval.shape[0] for v in tables if len(v.aval.shape) == 1), default=1)
    return tuple(g if isinstance(g, int) else bound for g in gm.grid), bound


def predict_kernel(eqn, chip: Chip = V6E) -> KernelEstimate:
    gm = eqn.params["grid_mapping"]
    grid, _ = static_grid(eqn)
    steps = math.prod(grid) if grid else 1
    grid_points = np.indices(grid).reshape(len(grid), -1).T if grid else np.zeros((1, 0), np.int32)
    flops, compute, manual_dma = _body_costs(eqn.params["jaxpr"], chip)

    overlapped = np.zeros(steps)
    serial = np.zeros(steps)
    total_bytes = 0.0
    n_in = gm.num_inputs
    for i, bm in enumerate(gm.block_mappings):
        if not _pipelined(bm):
            continue
        nbytes = _block_elems(bm) * np.dtype(bm.array_aval.dtype).itemsize
        idx = _block_indices(bm, grid_points, gm.num_index_operands)
        if idx is None:  # data-dependent index map: assume a fresh block every step
            moved = np.ones(steps, dtype=bool)
        else:
            moved = np.ones(steps, dtype=bool)
            moved[1:] = np.any(idx[1:] != idx[:-1], axis=1)
        if i >= n_in:  # an output block is written back when its index moves on
            moved = np.concatenate([moved[1:], [True]])
        traffic = moved * (nbytes / chip.hbm_bytes_per_s)
        total_bytes += float(moved.sum()) * nbytes
        (serial if _buffers(bm) < 2 else overlapped)[:] += traffic
    # Copies the body issues itself: assumed overlapped with compute, as kernels that
    # gather pages by hand start the next step's copies before waiting on their own.
    overlapped += manual_dma / chip.hbm_bytes_per_s
    total_bytes += manual_dma * steps

    step_time = np.maximum(overlapped, compute) + serial + chip.step_overhead_s
    # Fill: the first step's fetches are not overlapped; drain: nor is the last write-back.
    time_s = float(step_time.sum() + overlapped[0] + (overlapped[-1] if steps > 1 else 0.0))
    return KernelEstimate(
        name=str(eqn.params.get("name") or getattr(eqn.params.get("metadata"), "name", "") or "pallas_call"),
        grid=grid, steps=steps, hbm_bytes=total_bytes, mxu_flops=flops * steps,
        compute_s=compute * steps, dma_s=float((overlapped + serial).sum()), time_s=time_s,
        vmem_bytes=vmem_estimate(eqn),
    )


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def xla_roofline(flops: float, nbytes: float, transcendentals: float, chip: Chip = V6E) -> float:
    return max(flops / chip.mxu_flops_per_s, nbytes / chip.hbm_bytes_per_s) + transcendentals / chip.transcendentals_per_s


def predict_program(jaxpr, compiled, chip: Chip = V6E) -> SimBreakdown:
    """Predicted v6e seconds of a traced (``jaxpr``) and compiled (``compiled``) program."""
    kernels = [predict_kernel(e, chip) for e in pallas_call_eqns(jaxpr)]
    cost = _cost(compiled)
    kernel_io = sum(
        sum(math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize for v in list(e.invars) + list(e.outvars))
        for e in pallas_call_eqns(jaxpr)
    )
    glue_bytes = max(0.0, float(cost.get("bytes accessed", 0.0)) - kernel_io)
    glue_flops = max(0.0, float(cost.get("flops", 0.0)))
    glue_s = xla_roofline(glue_flops, glue_bytes, max(0.0, float(cost.get("transcendentals", 0.0))), chip)
    notes = []
    if any(e.params["grid_mapping"].num_index_operands for e in pallas_call_eqns(jaxpr)):
        notes.append("scalar-prefetch index maps priced as a fresh block every step")
    if any(_body_costs(e.params["jaxpr"], chip)[2] for e in pallas_call_eqns(jaxpr)):
        notes.append("hand-issued DMAs (dma_start) priced as overlapped with compute")
    bounds = sorted({b for b in (static_grid(e)[1] for e in pallas_call_eqns(jaxpr)) if b is not None})
    if bounds:
        notes.append(f"data-dependent grid axes priced at an upper bound ({', '.join(map(str, bounds))} steps): "
                     "an over-estimate")
    return SimBreakdown(time_s=sum(k.time_s for k in kernels) + glue_s, kernels=kernels, glue_s=glue_s, notes=notes)
