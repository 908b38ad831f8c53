"""What a ``pallas_call`` does per grid step, read from its jaxpr equation (chip-independent).

A ``pallas_call`` runs its grid in order. At each step the pipeline fetches the input
blocks whose block index changed since the previous step and writes back output blocks
whose index is about to change; with two or more buffers that traffic overlaps the step's
compute, with one it does not. The first step's fetch and the last write-back are not
hidden (pipeline fill and drain). Operands left in HBM (``pl.ANY``) are not pipelined; the
copies a body issues itself (``dma_start``) count by the bytes of their destination, in the
step that issues them only (never as fill or drain: a kernel that pipelines its own copies
hides them as the grid's pipeline does).

The body's work per step (MXU flops of ``dot_general``, vector and transcendental element
ops) is the analytic fallback for compute; the compiled kernel's bundles replace it where
they can be read (``bundles.py``). On this (jaxpr) path both branches of a ``cond``
(``pl.when``) count and a ``while`` loop once; the Mosaic path (``mosaic.py``) evaluates
trip counts and branches at every grid step, and gives ``assemble`` each step's bundles.

From block indices per step to traffic rows (``assemble``) is shared with ``mosaic.py``,
which reads the same kernel from the Mosaic module inside its ``tpu_custom_call`` (what the
judge compiles, with no jaxpr) and must give the same features.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

_TRANSCENDENTAL = {"exp", "exp2", "log", "log1p", "tanh", "logistic", "rsqrt", "sqrt", "sin", "cos", "erf", "pow",
                   "expm1", "erf_inv", "atan2"}
# No element work of their own: data movement, and calls and control flow (their bodies count).
_FREE = {"program_id", "num_programs", "get", "swap", "load", "store", "masked_load", "masked_swap",
         "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "convert_element_type", "iota", "pjit", "jit",
         "closed_call", "cond", "while", "scan", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
         "multiple_of"}


@dataclass
class KernelFeatures:
    """One pallas_call, as the pricing model needs it (JSON-able, so fits can re-price it)."""

    name: str
    grid: tuple
    steps: int
    traffic: list  # [overlapped bytes, serial bytes, number of steps] per distinct step
    fill_bytes: float  # the pipeline's first fetch (its blocks at step 0), not hidden
    drain_bytes: float  # the pipeline's last write-back, not hidden
    hbm_bytes: float
    flops: float  # per step on average, from here down (what runs at each step)
    vector_ops: float
    transcendentals: float
    vmem_bytes: int
    out_shapes: tuple = ()
    bundles_per_step: float | None = None  # from the compiled kernel, where readable: the mean over steps
    bundles_outside: float = 0.0  # prologue and epilogue around the grid loop
    # Bundles of one step for each traffic row (the steps of a row issue the same bundles);
    # None: every step issues ``bundles_per_step``.
    row_bundles: list | None = None
    # Groups of copies a step of each traffic row issues itself (each group waits out the copy
    # latency); None: none.
    row_dma_groups: list | None = None
    # Of those, groups the step waits for right after starting them (their bytes are in the
    # row's serial bytes; each waits out the latency in line); None: none.
    row_waited_groups: list | None = None
    dynamic_index: bool = False  # scalar-prefetch index maps: a fresh block every step assumed
    grid_bound: int | None = None  # the bound used for a data-dependent grid axis
    manual_dma: bool = False
    times: int = 1  # runs per program (inside a loop: lax.map over a batch)
    notes: list = field(default_factory=list)  # what pricing this kernel had to assume

    def to_dict(self) -> dict:
        return asdict(self)


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


def _block_bytes(bm) -> int:
    return _block_elems(bm) * np.dtype(bm.array_aval.dtype).itemsize


def _memory_space(bm) -> str:
    """"vmem", "smem", "any", "hbm", "semaphore" or "default" (VMEM for a TensorCore kernel)."""
    space = getattr(bm.transformed_block_aval, "memory_space", None)
    return str(space).lower().rsplit(".", 1)[-1] if space is not None else "default"


def _buffers(bm) -> int:
    """Buffers the pipeline gives a block: its pipeline mode's count, else two. Mosaic's
    lowering makes a VMEM block that is the whole array at index 0 single-buffered (it is
    fetched once), whatever its mode said."""
    if _memory_space(bm) in ("default", "vmem") and bm.has_trivial_window():
        return 1
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
    return _memory_space(bm) not in ("any", "hbm", "semaphore")


def vmem_estimate(eqn) -> int:
    """Bytes of VMEM a pallas_call's pipelined blocks and scratch need (no layout padding)."""
    gm = eqn.params["grid_mapping"]
    return pipeline_vmem([(_block_bytes(bm), _buffers(bm)) for bm in gm.block_mappings if _pipelined(bm)],
                         _scratch_bytes(gm))


def pipeline_vmem(blocks, scratch_bytes: int) -> int:
    """VMEM of a kernel's pipelined blocks ((bytes of one block, buffers) each) and scratch."""
    return int(sum(nbytes * buffers for nbytes, buffers in blocks)) + int(scratch_bytes)


def vmem_limit(eqn, scoped_default: int) -> int:
    params = eqn.params.get("compiler_params")
    limit = getattr(params, "vmem_limit_bytes", None)
    if limit is None and isinstance(params, dict):
        limit = getattr(params.get("mosaic"), "vmem_limit_bytes", None)
    return int(limit or scoped_default)


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


def jaxpr_eqns(jaxpr, times: float = 1.0):
    """Every equation of a jaxpr and its nested jaxprs, with how many times it runs (a scan's
    body ``length`` times; a while loop's, whose trip count the jaxpr does not say, once)."""
    for eqn in jaxpr.eqns:
        yield eqn, times
        inner = times * (eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1)
        for sub in _subjaxprs(eqn):
            yield from jaxpr_eqns(sub, inner)


def matmul_flops(eqn) -> float:
    """FLOPs of a dot_general or a convolution (2 per multiply-add), else 0."""
    name = eqn.primitive.name
    out = eqn.outvars[0].aval.shape
    if name == "dot_general":
        (contracting, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * math.prod(out) * math.prod(lhs[d] for d in contracting)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        return 2.0 * math.prod(out) * math.prod(rhs) / rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
    return 0.0


def body_work(jaxpr) -> tuple[float, float, float, float]:
    """(MXU flops, vector ops, transcendentals, bytes of hand-issued DMAs) of one run of a body,
    loops counted as ``jaxpr_eqns`` counts them."""
    flops = vec = trans = dma = 0.0
    for eqn, times in jaxpr_eqns(jaxpr):
        name = eqn.primitive.name
        out_elems = times * sum(math.prod(getattr(v.aval, "shape", ()) or (1,)) for v in eqn.outvars)
        if name in ("dot_general", "conv_general_dilated"):
            flops += times * matmul_flops(eqn)
        elif name == "dma_start":
            dma += times * _dma_bytes(eqn)
        elif name in _TRANSCENDENTAL:
            trans += out_elems
        elif name not in _FREE:
            vec += out_elems
    return flops, vec, trans, dma


def grid_points(grid: tuple) -> np.ndarray:
    """Every step's grid indices in the order the pipeline runs them (the last axis fastest),
    shape (steps, len(grid))."""
    if not grid:
        return np.zeros((1, 0), np.int64)
    return np.indices(grid).reshape(len(grid), -1).T


def _reads(jaxpr, variables) -> bool:
    """Whether any equation (or output) of ``jaxpr`` reads one of ``variables``."""
    wanted = set(variables)
    return any(v in wanted for eqn in jaxpr.eqns for v in eqn.invars if not hasattr(v, "val")) or \
        any(v in wanted for v in jaxpr.outvars if not hasattr(v, "val"))


def _block_indices(bm, points: np.ndarray, tables: list | None) -> np.ndarray | None:
    """Block index of this mapping at every grid step, shape (steps, ndim); None if it
    reads scalar-prefetch tables whose values are unknown (``tables`` None)."""
    import jax

    closed = bm.index_map_jaxpr
    n_ids = points.shape[1]
    n_tables = len(closed.jaxpr.invars) - n_ids
    n_out = len(closed.jaxpr.outvars)
    jaxpr, consts = closed.jaxpr, closed.consts
    unused = None
    if n_tables and not _reads(jaxpr, jaxpr.invars[n_ids:]):
        unused = [None] * n_tables  # an index map that ignores the tables: evaluate it without them
    elif n_tables and (tables is None or len(tables) != n_tables):
        return None
    elif n_tables:  # the tables are SMEM refs: turn their reads into array indexing
        from jax._src.state.discharge import discharge_state

        pure = discharge_state(closed)
        jaxpr, consts = pure.jaxpr, pure.consts

    def run(ids, tabs):
        return jax.core.eval_jaxpr(jaxpr, consts, *ids, *(unused if unused is not None else tabs))[:n_out]

    tabs = [] if unused is not None else list(tables or ())
    if n_ids:
        outs = jax.jit(jax.vmap(run, in_axes=(0, None)))(list(points.astype(np.int32).T), tabs)
    else:  # no grid: one step
        outs = jax.jit(lambda t: run([], t))(tabs)
    return np.stack([np.broadcast_to(np.asarray(o), (points.shape[0],)) for o in outs], axis=1) if outs \
        else np.zeros((points.shape[0], 0), np.int64)


def resolve_grid(axes, dynamic_bounds: list | None, table_shapes) -> tuple[tuple[int, ...], int | None]:
    """A grid whose ``axes`` are ints or None (sized at run time). A run-time axis takes its
    value on concrete inputs (``dynamic_bounds``, in order) where known, else an upper bound:
    the longest 1-D scalar-prefetch table (``table_shapes``; a schedule table has an entry per
    grid step, as in megablox's). Returns (grid, the upper bound used or None)."""
    if all(a is not None for a in axes):
        return tuple(int(a) for a in axes), None
    if dynamic_bounds is not None:
        values = iter(int(np.asarray(b).reshape(-1)[0]) for b in dynamic_bounds)
        return tuple(int(a) if a is not None else max(next(values), 1) for a in axes), None
    bound = max((shape[0] for shape in table_shapes if len(shape) == 1), default=1)
    return tuple(int(a) if a is not None else bound for a in axes), bound


def static_grid(eqn, dynamic_bounds: list | None = None) -> tuple[tuple[int, ...], int | None]:
    """The grid of a ``pallas_call`` equation (``resolve_grid``)."""
    gm = eqn.params["grid_mapping"]
    first = gm.num_dynamic_grid_bounds
    tables = [v.aval.shape for v in eqn.invars[first:first + gm.num_index_operands]]
    return resolve_grid([g if isinstance(g, int) else None for g in gm.grid],
                        dynamic_bounds if first else None, tables)


_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_vjp_call", "custom_jvp_call"}


def _called(eqn):
    """The ClosedJaxpr a call-like equation runs."""
    return eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")


def prefetch_operands(closed_jaxpr, make_inputs) -> dict[int, list]:
    """Concrete dynamic grid bounds and scalar-prefetch tables of each pallas_call (keyed by
    ``id(eqn)``) on the inputs ``make_inputs()`` returns.

    The program is re-traced with every pallas_call replaced by zeros, its prefetch operands
    as outputs, and run on the CPU: XLA drops all work those operands do not need (the
    kernels' big operands are never built). Kernels nested in loops or conditionals keep
    their upper bound."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Literal

    def data_dependent(eqn) -> bool:
        gm = eqn.params["grid_mapping"]
        return bool(gm.num_dynamic_grid_bounds + gm.num_index_operands)

    if not any(map(data_dependent, pallas_call_eqns(closed_jaxpr.jaxpr))):
        return {}  # nothing to evaluate: skip the CPU run
    keys: list[int] = []

    def run(jaxpr, consts, args, found):
        env = {}
        for v, a in [*zip(jaxpr.constvars, consts), *zip(jaxpr.invars, args)]:
            env[v] = a
        for eqn in jaxpr.eqns:
            ins = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
            name = eqn.primitive.name
            if name == "pallas_call":
                gm = eqn.params["grid_mapping"]
                n = gm.num_dynamic_grid_bounds + gm.num_index_operands
                if n:
                    keys.append(id(eqn))
                    found.append(ins[:n])
                outs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
            elif name in _CALLS and pallas_call_eqns(_called(eqn).jaxpr):
                outs = run(_called(eqn).jaxpr, _called(eqn).consts, ins, found)
            else:
                with eqn.ctx.manager:
                    outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
                outs = outs if eqn.primitive.multiple_results else [outs]
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

    def operands():
        found: list = []
        run(closed_jaxpr.jaxpr, closed_jaxpr.consts, make_inputs(), found)
        return found

    values = jax.jit(operands)()
    return {k: [np.asarray(x) for x in v] for k, v in zip(keys, values)}


def kernel_name(eqn) -> str:
    """The kernel's name as Mosaic gets it: the pallas_call's ``name``, else its body function's."""
    debug = getattr(eqn.params.get("jaxpr"), "debug_info", None)
    return str(eqn.params.get("name") or getattr(eqn.params.get("name_and_src_info"), "name", "")
               or getattr(debug, "func_name", "") or "pallas_call")


@dataclass
class Stream:
    """One pipelined operand of a kernel, as the traffic model needs it."""

    nbytes: float  # bytes of one block
    indices: np.ndarray | None  # block index at every grid step (steps, ndim); None: unknown
    output: bool
    buffers: int


def _distinct_rows(columns: list) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of equally long columns, in lexicographic order, and how often each
    occurs (``np.unique(..., axis=0)``, without its slow row sort: each column is ranked on
    its own, and the rows counted by one combined integer key)."""
    key = np.zeros(len(columns[0]), np.int64)
    values = []
    for col in columns:
        col = np.asarray(col)
        found = np.unique(col)
        values.append(found)
        if len(found) > 1:
            key = key * len(found) + np.searchsorted(found, col)
    sizes = [len(v) for v in values]
    space = math.prod(sizes)
    if space <= max(4 * len(key), 1 << 16):
        counts = np.bincount(key, minlength=space)
        keys = np.flatnonzero(counts)
        counts = counts[keys]
    else:
        keys, counts = np.unique(key, return_counts=True)
    rows = []
    for found, size in zip(reversed(values), reversed(sizes)):  # decode the key, last column first
        rows.append(found[keys % size] if size > 1 else np.full(len(keys), found[0]))
        if size > 1:
            keys = keys // size
    return np.stack(rows[::-1], axis=1), counts


def assemble(name: str, grid: tuple, streams: list[Stream], work: tuple, vmem_bytes: int, out_shapes: tuple,
             grid_bound: int | None = None, bundles=None, dma_groups=None, waited_dma=0.0,
             waited_groups=None) -> KernelFeatures:
    """A kernel's features from its grid, its pipelined operands' block indices per step, and
    its body's work per step ((flops, vector ops, transcendentals, hand-issued DMA bytes):
    the DMA bytes a number or one value per step); ``bundles``: the compiled kernel's bundles
    at each step (an array), if read; ``dma_groups``: groups of DMAs the body issues itself
    (copies started together), a number or one value per step; ``waited_dma`` and
    ``waited_groups``: the bytes and groups of the copies it waits for right after starting
    them (nothing runs behind those: serial traffic), likewise.

    An input block is fetched when its index differs from the previous step's (always at the
    first); an output block is written back when its index is about to change (always at the
    last). A stream whose indices are unknown moves a block every step. Two or more buffers
    overlap that traffic with compute; one serialises it. Steps are grouped into traffic rows
    by their bytes and bundles."""
    flops, vec, trans, manual_dma = work
    steps = math.prod(grid)  # 1 for no grid
    overlapped = np.zeros(steps)
    serial = np.zeros(steps)
    for s in streams:
        moved = np.ones(steps, dtype=bool)
        if s.indices is not None:
            moved[1:] = np.any(s.indices[1:] != s.indices[:-1], axis=1)
        if s.output:  # an output block is written back when its index moves on
            moved = np.concatenate([moved[1:], [True]])
        (serial if s.buffers < 2 else overlapped)[:] += moved * s.nbytes
    # The pipeline's own first fetch and last write-back are what no step hides; copies the
    # body issues itself are charged in their step only.
    fill, drain = float(overlapped[0]) if steps else 0.0, float(overlapped[-1]) if steps > 1 else 0.0
    # Copies the body issues itself overlap its compute (kernels that gather pages by hand
    # start the next copies before waiting on their own), except those it waits for at once.
    overlapped += manual_dma
    serial += waited_dma
    columns = [overlapped, serial]
    varying = bundles is not None and np.ndim(bundles) and steps > 1 and np.ptp(bundles) > 0
    if varying:
        columns.append(np.asarray(bundles, np.float64))
    extra = {}
    for key, value in (("groups", dma_groups), ("waited", waited_groups)):
        if np.any(np.asarray(value if value is not None else 0.0) > 0):
            extra[key] = len(columns)
            columns.append(np.broadcast_to(np.asarray(value, np.float64), (steps,)))
    rows, counts = _distinct_rows(columns)
    mean_bundles = float(np.mean(bundles)) if bundles is not None else None
    return KernelFeatures(
        name=name, grid=tuple(int(g) for g in grid), steps=steps,
        traffic=[[float(r[0]), float(r[1]), int(c)] for r, c in zip(rows, counts)],
        fill_bytes=fill, drain_bytes=drain,
        hbm_bytes=float(overlapped.sum() + serial.sum()),
        flops=float(flops), vector_ops=float(vec), transcendentals=float(trans), vmem_bytes=int(vmem_bytes),
        out_shapes=tuple(tuple(int(d) for d in shape) for shape in out_shapes),
        dynamic_index=any(s.indices is None for s in streams), grid_bound=grid_bound,
        manual_dma=bool(np.any(np.asarray(manual_dma) + np.asarray(waited_dma) > 0)), bundles_per_step=mean_bundles,
        row_bundles=[float(r[2]) for r in rows] if varying else None,
        row_dma_groups=[float(r[extra["groups"]]) for r in rows] if "groups" in extra else None,
        row_waited_groups=[float(r[extra["waited"]]) for r in rows] if "waited" in extra else None,
    )


def kernel_features(eqn, prefetch: list | None = None) -> KernelFeatures:
    """``prefetch``: the concrete dynamic grid bounds and scalar-prefetch tables, if known."""
    gm = eqn.params["grid_mapping"]
    n_bounds = gm.num_dynamic_grid_bounds
    grid, bound = static_grid(eqn, prefetch[:n_bounds] if prefetch is not None else None)
    tables = prefetch[n_bounds:] if prefetch is not None else None
    points = grid_points(grid)
    streams = [Stream(_block_bytes(bm), _block_indices(bm, points, tables), i >= gm.num_inputs, _buffers(bm))
               for i, bm in enumerate(gm.block_mappings) if _pipelined(bm)]
    return assemble(kernel_name(eqn), grid, streams, body_work(eqn.params["jaxpr"]), vmem_estimate(eqn),
                    tuple(v.aval.shape for v in eqn.outvars), bound)
