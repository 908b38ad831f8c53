"""Pallas TPU kernels as the compiler receives them: Mosaic modules inside ``tpu_custom_call``s.

A ``pallas_call`` lowered for TPU becomes a ``tpu_custom_call`` whose backend config holds
the kernel as serialized Mosaic MLIR (bytecode, base64). Everything the simulator and the
judge need to know about a kernel is in that module: the grid (``iteration_bounds``), one
window per operand (block shape and index map, ``window_params``), scalar prefetch and
scratch operands, and the body. Reading kernels from the artifact, not from a jaxpr the
candidate's process built, is what lets the judge price what it compiled itself.

This file finds the calls in StableHLO text (an exported program) or compiled HLO text,
decodes their modules (``parse_kernel``), evaluates their index maps over the grid without
running any of the candidate's code (``block_indices``), and from that gives the same
``KernelFeatures`` as the jaxpr path (``kernel_features``) and checks that the grid writes
every element of every output (``output_coverage``).

What runs at each grid step is evaluated too (``control_counts``): every ``scf.for``,
``scf.while`` and ``scf.if`` of the body, with the scalar ops their bounds and predicates
are computed from (grid indices, constants, scalar-prefetch values, scalars the kernel keeps
in SMEM from step to step), over the whole grid at once, on integer intervals: a loop's
trip count at each step (iterated one by one where what is inside depends on its
iteration), a branch's side. A bound that depends on data loaded in the kernel is replaced
by an upper bound where one can be derived (a ``jnp.minimum`` with a constant, a table's
largest value), with a note; with none the kernel is ``Unpriceable``. A predicate that
cannot be evaluated charges both sides. The compiled kernel's loops and branches
(``bundles.BundleProfile.control``) are matched to the body's (an ordered tree alignment
that keeps nesting, with sizes as a tie-breaker), and each step is charged its bundles:
those outside any such loop or branch, each loop body times its iterations at that step,
each branch's bundles where its side runs (``step_bundles``).

Conventions, as jax's Pallas lowering writes them (checked on exported kernels):

- the custom call's operands are the dynamic grid bounds (one scalar per
  ``iteration_bounds`` entry that is ``MLIR_DYNAMIC``), the scalar-prefetch operands
  (``scalar_prefetch`` of them), then the kernel's inputs; its results are the outputs;
- the kernel function's arguments are the grid indices (i32, one per grid axis), the
  scalar-prefetch refs (SMEM), one ref per input and output, then ``scratch_operands``
  scratch refs; ``window_params`` has one entry per input and output: ``window_bounds``
  (the block shape, squeezed dimensions as 1), ``transform_indices`` (the index map,
  ``@transform_N``, taking the grid indices then the scalar-prefetch refs and returning the
  block index) and ``pipeline_mode`` (``synchronous``: one buffer, ``double_buffered``: two;
  absent: two). An empty entry is an operand left in HBM (``pl.ANY``) or a semaphore: not
  pipelined. A kernel without a grid has no ``iteration_bounds`` nor ``window_params``:
  every operand is copied whole;
- the body's ops are in generic form, named ``stable_mosaic.<dialect>.<op>``.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .pallas import resolve_grid

if TYPE_CHECKING:
    from .pallas import KernelFeatures

TARGET = "tpu_custom_call"
MLIR_DYNAMIC = -(2**63)  # an iteration bound sized at run time
_PREFIX = "stable_mosaic."


@dataclass(frozen=True)
class CustomCall:
    """One ``tpu_custom_call``: where it is, its operand and result types, its kernel."""

    name: str  # the HLO op name (compiled HLO) or "" (StableHLO)
    operands: tuple  # ((dims...), dtype) per operand
    results: tuple  # ((dims...), dtype) per result
    config: dict  # the backend config (JSON)
    aliases: tuple = ()  # (result index, operand index) of each output aliased to an input
    pallas: bool = True  # False for the compiler's own Mosaic kernels (no kernel_metadata)

    @property
    def body(self) -> bytes:
        """The Mosaic module, serialized (MLIR bytecode)."""
        return base64.b64decode(self.config["custom_call_config"]["body"])


def _unescape_mlir(s: str) -> str:
    """An MLIR string literal's contents (``\\22`` is a quote, ``\\\\`` a backslash)."""
    return re.sub(r"\\(\\|[0-9A-Fa-f]{2})", lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1), 16)), s)


_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
_HLO_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_STABLEHLO_ALIAS = re.compile(r"output_operand_alias<output_tuple_indices = \[([\d, ]*)\], operand_index = (\d+)")
_HLO_ALIAS = re.compile(r"\{([\d, ]*)\}: \((\d+), \{[\d, ]*\}\)")


def _tensor_types(text: str) -> tuple:
    return tuple((tuple(int(d) for d in dims.split("x") if d), dtype) for dims, dtype in _TENSOR.findall(text))


def _hlo_types(text: str) -> tuple:
    return tuple((tuple(int(d) for d in dims.split(",") if d), dt) for dt, dims in _HLO_ARRAY.findall(text))


def _alias_pairs(found) -> tuple:
    return tuple((int(out.split(",")[0]) if out.strip() else 0, int(operand)) for out, operand in found)


def stablehlo_custom_calls(module_text: str) -> list[CustomCall]:
    """The ``tpu_custom_call``s of a StableHLO module (``Exported.mlir_module()``), in order."""
    calls = []
    for m in re.finditer(r"stablehlo\.custom_call @" + TARGET + r"\(.*?\) \{(.*?)\} : \((.*?)\) -> (.*?)(?: loc\(|\n)",
                         module_text):
        attrs, ins, outs = m.groups()
        cfg = re.search(r'backend_config = "((?:[^"\\]|\\.)*)"', attrs)
        if cfg is None:
            raise ValueError("a tpu_custom_call without a backend_config")
        calls.append(CustomCall("", _tensor_types(ins), _tensor_types(outs), json.loads(_unescape_mlir(cfg.group(1))),
                                _alias_pairs(_STABLEHLO_ALIAS.findall(attrs))))
    return calls


_HLO_INSTR = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*?)\)")


def hlo_custom_calls(hlo_text: str) -> list[CustomCall]:
    """The ``tpu_custom_call``s of a compiled HLO module (``compiled.as_text()``), in order.

    Compiled HLO names its operands without their types: they are looked up by name (HLO
    instruction names are unique in a module). ``pallas`` is False for the compiler's own
    Mosaic kernels, which carry no ``kernel_metadata``."""
    calls = []
    decoder = json.JSONDecoder()
    shapes: dict[str, str] = {}
    lines = hlo_text.splitlines()
    for line in lines:
        m = _HLO_INSTR.match(line)
        if m:
            shapes[m.group(1)] = m.group(2)
    for line in lines:
        if f'custom_call_target="{TARGET}"' not in line:
            continue
        m = _HLO_INSTR.match(line)
        start = line.find("backend_config=")
        if m is None or start < 0:
            continue
        config, _ = decoder.raw_decode(line[start + len("backend_config="):])
        args = line[line.find("custom-call(") + len("custom-call("):line.find("), custom_call_target=")]
        if "[" in args:  # typed operands: "bf16[8,128]{1,0} %x, ..."
            operands = list(_hlo_types(re.sub(r"\{[^}]*\}", "", args)))
        else:
            operands = []
            for name in re.findall(r"%([\w.\-]+)", args):
                types = _hlo_types(shapes.get(name, ""))
                if len(types) != 1:
                    raise ValueError(f"the type of operand %{name} of {m.group(1)} is unknown")
                operands.append(types[0])
        aliasing = re.search(r"output_to_operand_aliasing=\{((?:\{[\d, ]*\}: \(\d+, \{[\d, ]*\}\)(?:, )?)*)\}", line)
        aliases = _alias_pairs(_HLO_ALIAS.findall(aliasing.group(1))) if aliasing else ()
        calls.append(CustomCall(m.group(1), tuple(operands), _hlo_types(m.group(2)), config, aliases,
                                "kernel_metadata=" in line))
    return calls


def match_calls(compiled: list[CustomCall], exported: list[CustomCall]) -> list[int | None]:
    """For each call of a compiled program, the index of the same kernel among the calls of
    the exported program it was compiled from (None for a kernel the compiler made itself):
    the same Mosaic module (the compiler passes it through byte for byte) with the same
    operand and result shapes, taken in order among identical ones. Use it to put values
    listed in the exported program's order (``prefetch.prefetch_tables``) in the compiled
    program's (``model.program_features``)."""
    def key(c):
        return c.body, tuple(d for d, _ in c.operands), tuple(d for d, _ in c.results)

    free: dict = {}
    for j, c in enumerate(exported):
        free.setdefault(key(c), []).append(j)
    return [free[key(c)].pop(0) if free.get(key(c)) else None for c in compiled]


@functools.cache
def _mlir_ir():
    """jax's MLIR Python bindings (imported once: an import per op is slow)."""
    from jax._src.lib.mlir import ir

    return ir


@functools.cache
def _quiet_dialect_lookup() -> None:
    """Give the ``stable_mosaic`` op prefix an (empty) dialect module: without one, MLIR's
    Python bindings try to import it from every search path for every op they wrap (and
    cache no failure), which makes walking a large kernel take seconds."""
    import sys
    import types

    globals_ = getattr(_mlir_ir(), "_globals", None)
    for prefix in getattr(globals_, "dialect_search_modules", None) or ():
        name = f"{prefix}.{_PREFIX[:-1]}"
        sys.modules.setdefault(name, types.ModuleType(name))


def kernel_module(body: bytes):
    """The Mosaic module parsed into MLIR's Python objects (ops in generic form, names
    prefixed ``stable_mosaic.``). Returns (context, module): keep the context alive."""
    from jax._src.lib import tpu
    from jax._src.lib.mlir import ir

    ctx = ir.Context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    _quiet_dialect_lookup()
    with ctx:
        return ctx, ir.Module.parse(body)


# --- a kernel, parsed ----------------------------------------------------------------------

_ITEMSIZE = {"pred": 1, "i1": 1, "bool": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "tf32": 4,
             "s4": 0.5, "u4": 0.5, "i4": 0.5, "ui4": 0.5, "si4": 0.5}


def itemsize(dtype: str) -> float | None:
    """Bytes per element of an HLO, StableHLO or MLIR element type ("bf16", "s32", "i32",
    "ui8", "f8E4M3FN", ...); None for what is not data (a semaphore)."""
    d = dtype.strip()
    if d in _ITEMSIZE:
        return _ITEMSIZE[d]
    m = re.fullmatch(r"(?:[su]i?|i|ui|si|f|bf)(\d+)(?:[A-Za-z]\w*)?", d)
    return int(m.group(1)) / 8 if m else None


@dataclass(frozen=True)
class Window:
    """One input or output of a kernel: the array and how the pipeline moves it."""

    index: int  # position among the kernel's inputs then outputs
    output: bool
    shape: tuple  # the whole array
    dtype: str
    memory_space: str  # of the kernel's ref: "vmem", "smem", "any", "hbm", "semaphore_mem"
    block_shape: tuple | None  # window_bounds; None: not pipelined (left in HBM, or a semaphore)
    buffers: int = 2
    transform: str | None = None  # the index map's function name
    element: bool = False  # an element window: the index map gives element offsets

    @property
    def pipelined(self) -> bool:
        return self.block_shape is not None

    @property
    def block_bytes(self) -> float:
        return math.prod(self.block_shape or ()) * (itemsize(self.dtype) or 0)


@dataclass(frozen=True)
class Scratch:
    shape: tuple
    dtype: str  # MLIR element type ("f32", "!tpu.dma_semaphore")
    memory_space: str

    @property
    def nbytes(self) -> float:
        return math.prod(self.shape) * (itemsize(self.dtype) or 0)


@dataclass(frozen=True)
class Transform:
    """An index map as straight-line code: ``ops`` are (op name without the
    ``stable_mosaic.`` prefix, result ids, operand ids, attributes (``value``,
    ``predicate``), result bit widths, operand bit widths (0 for a ref)). Operand ids:
    ("arg", n) for the function's n-th argument (the grid indices, then the
    scalar-prefetch refs), an int for an op result. ``supported`` is False when the
    function has ops with regions or several blocks."""

    n_args: int
    ops: tuple
    supported: bool = True


@dataclass(frozen=True)
class Kernel:
    """A Pallas kernel as its Mosaic module describes it."""

    name: str
    iteration_bounds: tuple  # the grid; None for an axis sized at run time
    dimension_semantics: tuple  # "parallel", "arbitrary", ... per grid axis
    prefetch: tuple  # ((dims...), dtype) of each scalar-prefetch operand
    windows: tuple  # Window per input then output
    scratch: tuple  # Scratch per scratch operand
    # One run of the body, counted statically (``_body_work``: loops with constant bounds
    # their trip count times, other loops once, both sides of every branch); what runs at
    # each grid step is ``control_counts``'s.
    flops: float  # MXU flops of the matmuls
    vector_ops: float  # elements produced by vector and scalar ops
    transcendentals: float
    dma_bytes: float  # bytes of the DMAs the body issues itself (their destinations)
    transforms: dict = field(default_factory=dict)  # name -> Transform
    aliases: tuple = ()  # (output, operand of the custom call) pairs
    body: Body | None = field(default=None, compare=False)  # its loops, branches and work, step by step

    @property
    def num_dynamic_bounds(self) -> int:
        return sum(b is None for b in self.iteration_bounds)

    @property
    def num_leading(self) -> int:
        """Operands of the custom call before the inputs: dynamic bounds, scalar prefetch."""
        return self.num_dynamic_bounds + len(self.prefetch)

    @property
    def inputs(self) -> tuple:
        return tuple(w for w in self.windows if not w.output)

    @property
    def outputs(self) -> tuple:
        return tuple(w for w in self.windows if w.output)

    @property
    def scratch_bytes(self) -> float:
        return sum(s.nbytes for s in self.scratch)

    @property
    def vmem_bytes(self) -> int:
        """VMEM of the pipelined blocks (times their buffers) and scratch, without layout
        padding (``kernel_features(...).vmem_bytes``, without evaluating the grid)."""
        from .pallas import pipeline_vmem

        return pipeline_vmem([(w.block_bytes, w.buffers) for w in self.windows if w.pipelined], self.scratch_bytes)


_SPACE = re.compile(r"#tpu\.memory_space<(\w+)>")
_TRANSCENDENTAL = {"math." + n for n in ("exp", "exp2", "log", "log1p", "log2", "log10", "tanh", "rsqrt", "sqrt",
                                         "sin", "cos", "tan", "erf", "erfc", "powf", "fpowi", "expm1", "atan",
                                         "atan2", "cbrt", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh")}
# Ops that move, reinterpret or address data, or control flow: no element work of their own
# (as the jaxpr path treats loads, stores, broadcasts, reshapes, converts, iota and DMAs).
_FREE = {"arith.constant", "arith.index_cast", "arith.index_castui", "arith.extf", "arith.truncf", "arith.extsi",
         "arith.extui", "arith.trunci", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.fptoui",
         "arith.bitcast", "vector.load", "vector.store", "vector.broadcast", "vector.shape_cast",
         "vector.transfer_read", "vector.transfer_write", "memref.load", "memref.store", "tpu.load", "tpu.store",
         "tpu.vector_store", "tpu.strided_load", "tpu.strided_store", "tpu.iota", "tpu.assume_multiple",
         "tpu.memref_slice", "tpu.memref_squeeze", "tpu.memref_reshape", "tpu.memref_bitcast",
         "tpu.reinterpret_cast", "tpu.enqueue_dma", "tpu.wait_dma", "tpu.wait_dma2", "tpu.sem_signal",
         "tpu.sem_wait", "tpu.sem_read", "tpu.sem_barrier", "tpu.barrier", "tpu.trace_start", "tpu.trace_stop",
         "tpu.matmul", "tpu.bitcast", "tpu.bitcast_vreg", "tpu.erase_memref_layout", "tpu.assume_layout",
         "tpu.delay", "tpu.device_id", "tpu.yield", "scf.yield", "scf.condition", "func.return", "func.call",
         "scf.if", "scf.for", "scf.while", "scf.execute_region", "tpu.region", "tpu.internal_scratch",
         "tpu.create_mask", "tpu.create_subelement_mask", "vector.create_mask", "vector.constant_mask"}


def _short(op) -> str:
    name = op.name
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def _memref(t) -> tuple[tuple, str, str] | None:
    """(shape, element type, memory space) of a memref type, else None."""
    ir = _mlir_ir()

    if not isinstance(t, ir.MemRefType):
        return None
    space = _SPACE.search(str(t.memory_space)) if t.memory_space is not None else None
    return tuple(int(d) for d in t.shape), str(t.element_type), space.group(1) if space else "vmem"


def _elements(t) -> float:
    """Elements of a value of type ``t``: a vector's, 1 for a scalar, 0 for anything else."""
    ir = _mlir_ir()

    if isinstance(t, ir.VectorType):
        return float(math.prod(t.shape))
    if isinstance(t, (ir.IntegerType, ir.IndexType, ir.FloatType)) or str(t) in ("f32", "bf16", "f16", "f64"):
        return 1.0
    return 0.0


def _int_attr(attr) -> int | None:
    ir = _mlir_ir()

    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.BoolAttr):
        return int(attr.value)
    return None


_FOLD = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
         "arith.floordivsi": lambda a, b: a // b if b else None,
         "arith.ceildivsi": lambda a, b: -(-a // b) if b else None,
         "arith.divsi": lambda a, b: int(a / b) if b else None,
         "arith.minsi": min, "arith.maxsi": max}


def _constant(value, depth: int = 8) -> int | None:
    """The value of an integer scalar computed from constants only (``arith.constant``s
    and a few arithmetic ops over them, as loop bounds are written), else None."""
    owner = getattr(value, "owner", None)
    op = getattr(owner, "operation", None)
    if op is None or depth < 0:
        return None
    name = _short(op)
    if name == "arith.constant":
        return _int_attr(op.attributes["value"]) if "value" in op.attributes else None
    if name in ("arith.index_cast", "arith.extsi", "arith.trunci") and len(op.operands) == 1:
        return _constant(op.operands[0], depth - 1)
    if name in _FOLD and len(op.operands) == 2:
        a, b = (_constant(v, depth - 1) for v in op.operands)
        return None if a is None or b is None else _FOLD[name](a, b)
    return None


def _matmul_flops(op) -> float:
    lhs = list(op.operands[0].type.shape)
    out = _elements(op.results[0].type)
    contracting = None
    if "dimension_numbers" in op.attributes:
        m = re.search(r"<\[([\d, ]*)\]", str(op.attributes["dimension_numbers"]))
        if m:
            contracting = [int(d) for d in m.group(1).split(",") if d.strip()]
    if contracting is None:
        transposed = "transpose_lhs" in op.attributes and str(op.attributes["transpose_lhs"]) == "true"
        contracting = [len(lhs) - 2 if transposed else len(lhs) - 1]
    return 2.0 * out * math.prod(lhs[d] for d in contracting)


def _copy_operands(op, name: str) -> tuple:
    """(semaphore, target) of an ``enqueue_dma`` (source, source semaphore?, target, target
    semaphore, ...) or a ``wait_dma2`` (semaphore, source, target, ...)."""
    operands = list(op.operands)
    if "operandSegmentSizes" not in op.attributes:
        return None, operands[2] if name == "tpu.enqueue_dma" else operands[-1]
    sizes = list(_mlir_ir().DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    target = sizes[0] + sizes[1]
    if name == "tpu.enqueue_dma":
        return operands[target + sizes[2]], operands[target]
    return operands[0], operands[target]


def _dma_bytes(op) -> float:
    """Bytes one ``enqueue_dma`` copies: its target's (sliced) shape."""
    info = _memref(_copy_operands(op, "tpu.enqueue_dma")[1].type)
    if info is None:
        return 0.0
    shape, dtype, _ = info
    return float(math.prod(shape) * (itemsize(dtype) or 0))


def _body_work(body: Body) -> tuple[float, float, float, float]:
    """(MXU flops, vector ops, transcendentals, DMA bytes) of one run of a kernel body,
    counted statically: an ``scf.for`` with constant bounds counts its trip count times,
    other loops once, both sides of an ``scf.if`` (as the jaxpr path counts a ``cond``'s).
    What runs at each grid step (trip counts and branches evaluated over the grid) is
    ``control_counts``'s, which the analytic fallback prices."""
    total = [0.0, 0.0, 0.0, 0.0]
    stack = [(body.region, 1.0)]
    while stack:
        region, times = stack.pop()
        for k in range(4):
            total[k] += times * region.work[k]
        total[3] += times * region.work[5]
        for op in region.ops:
            inner = times
            if op.name == "scf.for" and op.item >= 0:
                trip = body.items[op.item].static_trip
                inner = times * trip if trip is not None else times
            stack.extend((sub, inner) for sub in op.regions)
    return total[0], total[1], total[2], total[3]


def _width(t) -> int:
    ir = _mlir_ir()

    if isinstance(t, ir.IntegerType):
        return t.width
    return 64  # index


def _transform(func_op) -> Transform:
    blocks = list(func_op.regions[0].blocks)
    if len(blocks) != 1:
        return Transform(0, (), False)
    block = blocks[0]
    ids: dict = {arg: ("arg", i) for i, arg in enumerate(block.arguments)}
    ops, supported = [], True
    for op in block.operations:
        op = op.operation
        if len(op.regions):
            supported = False
        results = []
        for r in op.results:
            ids[r] = len(ids)
            results.append(ids[r])
        operands = tuple(ids.get(v) for v in op.operands)
        attrs = {}
        for key in ("value", "predicate"):
            if key in op.attributes:
                attrs[key] = _int_attr(op.attributes[key])
        ops.append((_short(op), tuple(results), operands, attrs,
                    tuple(_width(r.type) for r in op.results),
                    tuple(_width(v.type) if not _memref(v.type) else 0 for v in op.operands)))
    return Transform(len(block.arguments), tuple(ops), supported)


# --- the body as control flow ------------------------------------------------------------


# What evaluating a kernel's loops, branches and index maps over its grid raises on a body it
# cannot follow (malformed or unsupported ops): not a price, and not a guess either.
EVALUATION_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError)


class Unpriceable(ValueError):
    """A kernel the simulator cannot price honestly: a loop whose trip count it can neither
    evaluate nor bound (its bound depends on data the kernel loads, with no cap)."""


_LOOPS = ("scf.for", "scf.while")
_CONTROL = ("scf.for", "scf.while", "scf.if")


@dataclass(frozen=True, eq=False)
class _Region:
    args: tuple  # value ids of the block's arguments
    ops: tuple  # _Op
    work: tuple  # (flops, vector ops, transcendentals, DMA bytes, DMA groups) of its own ops (nested regions not)
    size: int = 0  # its ops but yields and constants (0: nothing to branch over)


@dataclass(frozen=True, eq=False)
class _Op:
    name: str  # without the ``stable_mosaic.`` prefix
    results: tuple  # value ids
    operands: tuple  # value ids
    attrs: dict  # "value", "predicate", "dimension" where present
    widths: tuple  # per result: bit width of an integer or index scalar (index: 64), 0 otherwise
    in_widths: tuple  # per operand, the same
    regions: tuple = ()  # _Region
    item: int = -1  # a loop's item, an scf.if's then-arm item
    else_item: int = -1  # an scf.if's else-arm item
    decision: int = -1  # a comparison, select, min or max: its number in body order (``_DECISIONS``)
    at: int = -1  # its index among the kernel function's ops, in preorder (``pattern_sites``)


@dataclass(frozen=True)
class ControlItem:
    """A loop (``scf.for``, ``scf.while``) or one side of an ``scf.if`` in a kernel body, in
    body order (a branch's then side, what is inside it, then its else side)."""

    kind: str  # "loop" or "arm"
    op: str  # "scf.for", "scf.while" or "scf.if"
    parent: int  # the enclosing item, -1 for none
    label: str  # for messages
    static_trip: int | None = None  # an scf.for with constant bounds (or bounds a constant apart)
    empty: bool = False  # an arm without ops of its own (nothing to branch over)
    yields: bool = False  # an arm of an scf.if with results (the compiler may select instead)
    dependent: bool = False  # a loop whose inner loops or branches depend on its iteration
    estimate: float = 0.0  # a rough bundle count of one run of its body (matching tie-breaker)


@dataclass(frozen=True, eq=False)
class Body:
    """A kernel body reduced to what step-by-step pricing needs: its ops (scalar ones with
    their operands, all with their work), its loops and branches (``items``), and which
    values the trip counts and predicates depend on (``needed``)."""

    region: _Region
    items: tuple  # ControlItem, in body order
    needed: frozenset  # value ids feeding a loop bound, a predicate or a while condition
    written: frozenset  # arguments the body stores into (their loads are not the table's values)


def _op_work(op, name: str) -> tuple:
    if name == "tpu.matmul":
        return (_matmul_flops(op),) + _NO_WORK[1:]
    if name == "tpu.enqueue_dma":
        return (0.0, 0.0, 0.0, _dma_bytes(op)) + _NO_WORK[4:]  # its copy group: counted by ``_body_ir``
    if name in _TRANSCENDENTAL:
        return (0.0, 0.0, sum(_elements(r.type) for r in op.results)) + _NO_WORK[3:]
    if name not in _FREE:
        return (0.0, sum(_elements(r.type) for r in op.results)) + _NO_WORK[2:]
    return _NO_WORK


_REF_VIEWS = ("tpu.memref_slice", "tpu.memref_squeeze", "tpu.memref_reshape", "tpu.memref_bitcast",
              "tpu.reinterpret_cast")
_TERMINATORS = ("scf.yield", "scf.condition", "tpu.yield")
_STORES = ("tpu.vector_store", "vector.store", "tpu.store", "tpu.strided_store")
_MOVES = _STORES + ("vector.load", "tpu.load", "tpu.strided_load")
_MXU_FLOPS_PER_BUNDLE = 2.0 * 8 * 256 * 256  # rough: only to compare sizes
_ELEMENTS_PER_BUNDLE = 4096.0
# Rough too: whether the work between a copy's start and its wait can hide it (the copy
# latency, ~0.35 us, and v6e's HBM bandwidth, in bundles at ~1.9 GHz).
_COPY_LATENCY_BUNDLES = 650.0
_BUNDLES_PER_COPY_BYTE = 1.9e9 / 1.64e12
_ATTRS = {"arith.constant": "value", "arith.cmpi": "predicate", "tpu.iteration_bound": "dimension"}
# A region's work: MXU flops, vector ops, transcendentals, then the bytes and groups of the
# copies it issues that run behind compute, then those of copies it waits for right away
# (started and waited in one go: nothing overlaps them).
_NO_WORK = (0.0,) * 7
_WAITS = ("tpu.wait_dma", "tpu.wait_dma2")


def _ungrouped(sc) -> tuple:
    """A region scan (``_body_ir``'s) with its copy groups, nested ones included, set to none."""
    blk, entries, work, size, estimate, copies = sc
    return (blk, [(o, name, tuple(_ungrouped(sub) for sub in subs)) for o, name, subs in entries],
            work[:4] + (0.0, work[5], 0.0), size, estimate, copies)


def _waited(sc) -> tuple:
    """A region scan whose copies, nested ones included, are waited for right away: their
    bytes and groups move to the waited columns."""
    blk, entries, work, size, estimate, copies = sc
    return (blk, [(o, name, tuple(_waited(sub) for sub in subs)) for o, name, subs in entries],
            work[:3] + (0.0, 0.0, work[5] + work[3], work[6] + work[4]), size, estimate, copies)


def _ref_key(value, depth: int = 0):
    """What a ref (a semaphore, a copy's target) names, to tell whether a wait is for copies
    just started: its root argument and the indices sliced into it (constants by value)."""
    owner = value.owner
    if depth > 8 or hasattr(owner, "operations"):  # a block argument: the root
        return value
    op = owner.operation
    name = _short(op)
    operands = list(op.operands)
    if name == "tpu.memref_slice" and operands:
        return (_ref_key(operands[0], depth + 1), tuple(_index_key(v) for v in operands[1:]))
    if name in _REF_VIEWS and operands:
        return _ref_key(operands[0], depth + 1)
    return value


def _index_key(v):
    owner = v.owner
    if not hasattr(owner, "operations") and _short(owner.operation) == "arith.constant":
        return ("constant", _int_attr(owner.operation.attributes["value"]))
    return v


def _copy_key(op, name: str):
    """(semaphore, target buffer and its leading index) of an ``enqueue_dma`` or a wait, or None
    (never a match) where its operands are not laid out as expected."""
    try:
        sem, target = _copy_operands(op, name)
        if sem is None:
            return None
        dst = _ref_key(target)
        if isinstance(dst, tuple):  # the buffer and its leading index (the slot), not where in it
            dst = (dst[0], dst[1][:1])
        return _ref_key(sem), dst
    except (IndexError, KeyError, TypeError, ValueError):
        return None


def _body_ir(func_op) -> Body:
    """The compact body of a kernel function (its first block; a region with several blocks
    keeps its first): every op's work, and, with their operands, the loops, branches and the
    scalar ops their bounds and predicates are computed from (a backward slice through
    integer values; vector ops are never in it)."""
    ir = _mlir_ir()

    def width(t) -> int:
        if isinstance(t, ir.IntegerType):
            return t.width
        return 64 if isinstance(t, ir.IndexType) else 0

    def vector(o) -> bool:
        return any(isinstance(v.type, ir.VectorType) for v in (*o.operands, *o.results))

    def scan(reg):
        """(block, [(op, name, sub-scans)], work, size, estimate, copies) of a region: names
        and work only; ``estimate``: a rough bundle count of one run (nested regions included,
        loops once), to tell its loops and branches apart by size in the compiled kernel.

        Copies issued with nothing but scalar work between them are one group (in flight
        together, they wait out one latency), a loop that only issues copies included: its
        group counts once where the loop is, not once per trip. Copies waited for (the same
        semaphore and target slot: ``_copy_key``) after too little work since they started to
        hide them (by the rough estimate) are counted apart, as waited for in line.
        ``copies``: whether the region issues copies, whether it does nothing else (no vector
        work, no waits), the keys of the copies it issues and waits for, and whether it
        computes (nested regions included)."""
        blocks = list(reg.blocks)
        if not blocks:
            return None, [], _NO_WORK, 0, 0.0, (False, True, frozenset(), frozenset(), False)
        blk = blocks[0]
        entries, work, size, estimate = [], [0.0] * len(_NO_WORK), 0, 0.0
        issuing, issues, quiet, computes = False, False, True, False
        issued, waited = set(), set()  # copy keys (``_copy_key``) issued and waited for, nested included
        # Copies not yet waited for: [entry, keys, bytes copied, bytes and group in this region's
        # own work (a copy loop's bytes are in its body's), bundles since started].
        pending: list = []
        for o in blk.operations:
            o = o.operation
            name = _short(o)
            before = estimate
            if name not in ("scf.yield", "arith.constant"):
                size += 1
                estimate += 0.5
            w = _op_work(o, name)
            subs = tuple(scan(r) for r in o.regions) if len(o.regions) else ()
            inner_issues = any(sub[5][0] for sub in subs)
            inner_quiet = all(sub[5][1] for sub in subs)
            inner_keys = set().union(*(sub[5][2] for sub in subs)) if subs else set()
            inner_waits = set().union(*(sub[5][3] for sub in subs)) if subs else set()
            issues |= inner_issues
            copy_loop = name in _LOOPS and inner_issues and inner_quiet  # one group, here, not per trip
            if copy_loop:
                subs = tuple(_ungrouped(sub) for sub in subs)
            key = _copy_key(o, name) if name == "tpu.enqueue_dma" or name in _WAITS else None
            if name == "tpu.enqueue_dma" or copy_loop:
                issues = True
                w = (w[:4] + (0.0 if issuing else 1.0,) + w[5:])
                issuing = True
                if name == "tpu.enqueue_dma":
                    pending.append([len(entries), {key}, w[3], (w[3], w[4]), 0.0])
                else:
                    pending.append([len(entries), inner_keys, sum(sub[2][3] for sub in subs), (0.0, w[4]), 0.0])
            elif name in _WAITS or (inner_waits and not any(sub[5][4] for sub in subs)):
                issuing = quiet = False
                hit = {key} if name in _WAITS else inner_waits
                for i, _, copied, (own_bytes, group), between in [p for p in pending if p[1] & hit]:
                    if between >= _COPY_LATENCY_BUNDLES + copied * _BUNDLES_PER_COPY_BYTE:
                        continue  # the work since it started can hide it
                    # Waited for with too little work since it started to hide it: in line.
                    work[3] -= own_bytes
                    work[5] += own_bytes
                    work[4] -= group
                    work[6] += group
                    e_o, e_name, e_subs = entries[i]
                    entries[i] = (e_o, e_name, tuple(_waited(sub) for sub in e_subs))
                pending = [p for p in pending if not p[1] & hit]
            elif name == "tpu.matmul" or vector(o) or not inner_quiet:
                issuing = quiet = False
                computes |= name == "tpu.matmul" or vector(o) or any(sub[5][4] for sub in subs)
            issued |= {key} if name == "tpu.enqueue_dma" else inner_keys
            waited |= {key} if name in _WAITS else inner_waits
            if w is not _NO_WORK:
                for k in range(len(w)):
                    work[k] += w[k]
                estimate += w[0] / _MXU_FLOPS_PER_BUNDLE + (w[1] + w[2]) / _ELEMENTS_PER_BUNDLE
            elif name in _MOVES:
                moved = o.operands[0] if name in _STORES else (o.results[0] if len(o.results) else None)
                estimate += _elements(moved.type) / _ELEMENTS_PER_BUNDLE if moved is not None else 0.0
            estimate += sum(sub[4] for sub in subs)
            for p in pending[:-1] if name == "tpu.enqueue_dma" or copy_loop else pending:
                p[4] += estimate - before
            entries.append((o, name, subs))
        return blk, entries, tuple(work), size, estimate, (issues, quiet, frozenset(issued), frozenset(waited),
                                                           computes)

    top_scan = scan(func_op.regions[0])
    preorder: list = []
    func_op.walk(lambda o: (preorder.append(o), ir.WalkResult.ADVANCE)[1], ir.WalkOrder.PRE_ORDER)
    at = {o: i for i, o in enumerate(preorder[1:])}  # the function itself is not one of its ops

    # The slice: control operands, terminators' operands, and what computes them.
    seeds = []

    def collect(sc) -> None:
        for o, name, subs in sc[1]:
            if name in _CONTROL or name in _TERMINATORS or name == "memref.store":
                seeds.extend(o.operands)
            for sub in subs:
                collect(sub)

    collect(top_scan)
    in_slice: set = set()
    seen: set = set()
    while seeds:
        v = seeds.pop()
        if v in seen:
            continue
        seen.add(v)
        owner = v.owner
        if hasattr(owner, "operations"):  # a block argument
            continue
        op = owner.operation
        if op in in_slice or len(op.regions):
            continue
        if not width(v.type) and _memref(v.type) is None:
            continue  # a vector or a float: not evaluated
        in_slice.add(op)
        seeds.extend(op.operands)

    ids: dict = {}
    items: list = []
    written: set = set()
    roots: dict = {}  # value id -> the function argument a ref was derived from
    numbers = {"loop": 0, "branch": 0, "decision": 0}
    made: dict = {}  # value id -> (the name, the constant value) of the op defining it

    def vid(v):
        i = ids.get(v)
        if i is None:
            i = ids[v] = len(ids)
        return i

    block = top_scan[0]
    for i, a in enumerate(block.arguments):
        ids[a] = i
        roots[i] = i

    def build(sc, parent: int) -> _Region:
        blk, entries, work, size, *_ = sc
        if blk is None:
            return _Region((), (), _NO_WORK)
        args = tuple(vid(a) for a in blk.arguments)
        ops = []
        for o, name, subs in entries:
            if name == "memref.store":
                operands = list(o.operands)
                if len(operands) > 1 and ids.get(operands[1]) in roots:
                    written.add(roots[ids[operands[1]]])
            elif not (name in _CONTROL or name in _TERMINATORS or o in in_slice or subs):
                continue
            operands = tuple(vid(v) for v in o.operands)
            res = tuple(vid(r) for r in o.results)
            attrs = {}
            key = _ATTRS.get(name)
            if key is not None and key in o.attributes:
                attrs[key] = _int_attr(o.attributes[key])
            if name in _REF_VIEWS and operands and operands[0] in roots:
                roots[res[0]] = roots[operands[0]]
            item = else_item = -1
            regions: tuple = ()
            if name in _LOOPS:
                item = len(items)
                trip = None
                if name == "scf.for":
                    lo, hi, step = (_constant(v) for v in list(o.operands)[:3])
                    if None not in (lo, hi, step) and step > 0:
                        trip = max(0, -(-(hi - lo) // step))
                numbers["loop"] += 1
                items.append(ControlItem("loop", name, parent, f"loop {numbers['loop']} ({name})", trip,
                                         estimate=sum(sub[4] for sub in subs)))
                regions = tuple(build(sub, item) for sub in subs)
            elif name == "scf.if":
                numbers["branch"] += 1
                n = numbers["branch"]
                item = len(items)
                items.append(None)  # placed once its region is known (empty or not)
                then = build(subs[0], item)
                items[item] = ControlItem("arm", name, parent, f"branch {n} (scf.if, then)",
                                          empty=subs[0][3] == 0, yields=bool(res), estimate=subs[0][4])
                else_item = len(items)
                items.append(None)
                other = build(subs[1], else_item) if len(subs) > 1 else _Region((), (), _NO_WORK)
                items[else_item] = ControlItem("arm", name, parent, f"branch {n} (scf.if, else)",
                                               empty=len(subs) < 2 or subs[1][3] == 0, yields=bool(res),
                                               estimate=subs[1][4] if len(subs) > 1 else 0.0)
                regions = (then, other)
            elif subs:
                regions = tuple(build(sub, parent) for sub in subs)
            decision = -1
            if _decides(name, operands, made):
                decision = numbers["decision"]
                numbers["decision"] += 1
            made.update((r, (name, attrs.get("value"))) for r in res)
            ops.append(_Op(name, res, operands, attrs, tuple(width(r.type) for r in o.results),
                           tuple(width(v.type) for v in o.operands), regions, item, else_item, decision, at[o]))
        return _Region(args, tuple(ops), work, size)

    top = build(top_scan, -1)
    loops = {op.item: op for op in _all_ops(top) if op.name in _LOOPS}
    needed = _needed(top, roots)
    items = [_with_dependence(it, loops.get(i)) for i, it in enumerate(items)]
    items = _with_spans(items, top, loops)
    return Body(top, tuple(items), frozenset(needed), frozenset(written))


def _with_spans(items: list, top: _Region, loops: dict) -> list:
    """Loops whose bounds differ by a constant, whatever they are (``fori_loop(n, n + 4)``,
    the empty remainder loop ``fori_loop`` emits after its main loop): their trip count is
    known. Values are followed as affine forms of opaque values (constant + sum of
    coefficient x value)."""
    defs = {r: op for op in _all_ops(top) for r in op.results}
    forms: dict = {}

    def combine(a, b, sign: int):
        terms = dict(a[1])
        for atom, c in b[1]:
            terms[atom] = terms.get(atom, 0) + sign * c
        return (a[0] + sign * b[0], tuple(sorted((k, c) for k, c in terms.items() if c)))

    def form(v, depth: int = 0):
        if v in forms:
            return forms[v]
        op = defs.get(v)
        out = (0, ((v, 1),))
        if op is not None and depth < 64 and None not in op.operands:
            name, ins = op.name, op.operands
            if name == "arith.constant" and op.attrs.get("value") is not None and op.widths[0]:
                out = (op.attrs["value"], ())
            elif name in ("arith.index_cast", "arith.index_castui", "arith.extui", "arith.trunci",
                          "tpu.assume_multiple") or (name == "arith.extsi" and op.in_widths[0] != 1):
                out = form(ins[0], depth + 1)
            elif name in ("arith.addi", "arith.subi"):
                out = combine(form(ins[0], depth + 1), form(ins[1], depth + 1), 1 if name == "arith.addi" else -1)
            elif name == "arith.muli":
                a, b = form(ins[0], depth + 1), form(ins[1], depth + 1)
                if not b[1]:
                    a, b = b, a
                if not a[1]:
                    out = (a[0] * b[0], tuple((k, a[0] * c) for k, c in b[1] if a[0] * c))
            elif name in ("arith.divsi", "arith.floordivsi", "arith.ceildivsi") and form(ins[1], depth + 1) == (1, ()):
                out = form(ins[0], depth + 1)
        forms[v] = out
        return out

    out = []
    for i, it in enumerate(items):
        op = loops.get(i)
        if op is not None and op.name == "scf.for" and it.static_trip is None and None not in op.operands[:3]:
            d = combine(form(op.operands[1]), form(op.operands[0]), -1)
            step = form(op.operands[2])
            if not d[1]:
                trip = max(0, -(-d[0] // step[0])) if not step[1] and step[0] > 0 else None
                it = replace(it, static_trip=trip)
        out.append(it)
    return out


def _all_ops(r: _Region):
    for op in r.ops:
        yield op
        for sub in op.regions:
            yield from _all_ops(sub)


def _control_operands(op: _Op) -> tuple:
    if op.name == "scf.if":
        return op.operands[:1]
    if op.name == "scf.for":
        return op.operands[:3]
    if op.name == "scf.condition":
        return op.operands[:1]
    return ()


def _needed(top: _Region, roots: dict) -> set:
    """Value ids the loop bounds, branch predicates and while conditions depend on."""
    defs: dict = {}  # value id -> the op defining it
    feeds: dict = {}  # value id -> further values it depends on through control flow
    work: list = []
    for op in _all_ops(top):
        for r in op.results:
            defs[r] = op
        work.extend(v for v in _control_operands(op) if v is not None)
        regions = op.regions
        if op.name == "scf.if":
            for k, r in enumerate(op.results):
                feeds[r] = [sub.ops[-1].operands[k] for sub in regions
                            if sub.ops and sub.ops[-1].name == "scf.yield" and k < len(sub.ops[-1].operands)]
        elif op.name == "scf.for" and regions:
            body = regions[0]
            yields = body.ops[-1].operands if body.ops and body.ops[-1].name == "scf.yield" else ()
            for k, init in enumerate(op.operands[3:]):
                more = [init] + ([yields[k]] if k < len(yields) else [])
                if k < len(op.results):
                    feeds[op.results[k]] = more
                if k + 1 < len(body.args):
                    feeds[body.args[k + 1]] = more
        elif op.name == "scf.while" and len(regions) == 2:
            before, after = regions
            cond = before.ops[-1] if before.ops and before.ops[-1].name == "scf.condition" else None
            yields = after.ops[-1].operands if after.ops and after.ops[-1].name == "scf.yield" else ()
            for k, init in enumerate(op.operands):
                if k < len(before.args):
                    feeds[before.args[k]] = [init] + ([yields[k]] if k < len(yields) else [])
            if cond is not None:
                for j, fwd in enumerate(cond.operands[1:]):
                    if j < len(after.args):
                        feeds[after.args[j]] = [fwd]
                    if j < len(op.results):
                        feeds[op.results[j]] = [fwd]
    needed: set = set()

    def close(work: list) -> None:
        while work:
            v = work.pop()
            if v is None or v in needed:
                continue
            needed.add(v)
            work.extend(feeds.get(v, ()))
            op = defs.get(v)
            if op is not None and op.name not in _CONTROL:
                work.extend(op.operands)

    def element(op: _Op, first: int) -> tuple:
        """(the argument a ref comes from, its constant indices or None) of a load or store."""
        idx = []
        for v in op.operands[first:]:
            d = defs.get(v)
            while d is not None and d.name in ("arith.index_cast", "arith.index_castui") and d.operands[0] is not None:
                d = defs.get(d.operands[0])
            idx.append(d.attrs.get("value") if d is not None and d.name == "arith.constant" else None)
        ref = op.operands[0] if first == 1 else op.operands[1]
        return roots.get(ref), (tuple(idx) if None not in idx else None)

    # Scalars a kernel stores in SMEM and loads back (at a later step, or later in a step)
    # matter where what is loaded does: their stores are followed too.
    stores = [op for op in _all_ops(top) if op.name == "memref.store" and len(op.operands) > 1]
    close(work)
    followed: set = set()
    while True:
        loads = [element(op, 1) for op in _all_ops(top)
                 if op.name == "memref.load" and op.results and op.results[0] in needed]
        more = []
        for i, op in enumerate(stores):
            root, idx = element(op, 2)
            if i not in followed and root is not None and any(
                    r == root and (i1 is None or idx is None or i1 == idx) for r, i1 in loads):
                followed.add(i)
                more.extend(op.operands)
        if not more:
            return needed
        close(more)


def _downstream(body: Body, seeds: set) -> set:
    """The items (loops, arms) whose trip counts or predicates depend on the values ``seeds``
    (value ids): followed forward through scalar ops, loop-carried and yielded values, and
    (every load, once one is) scalars stored."""
    ops = list(_all_ops(body.region))
    tainted = set(seeds)
    stored = False  # a tainted value was stored: what any load reads may depend on it

    def yields(region: _Region) -> tuple:
        return region.ops[-1].operands if region.ops and region.ops[-1].name in _TERMINATORS else ()

    while True:
        before = (len(tainted), stored)
        for op in ops:
            if op.name == "memref.store":
                stored = stored or (bool(op.operands) and op.operands[0] in tainted)
            elif op.name == "memref.load" and stored:
                tainted.update(op.results)
            elif op.name == "scf.if":
                for k, r in enumerate(op.results):
                    if op.operands[0] in tainted or any(k < len(yields(g)) and yields(g)[k] in tainted
                                                        for g in op.regions):
                        tainted.add(r)
            elif op.name == "scf.for" and op.regions:
                loop = op.regions[0]
                out = yields(loop)  # (its induction variable takes its values: the loop itself is bounded)
                for k, init in enumerate(op.operands[3:]):
                    if init in tainted or (k < len(out) and out[k] in tainted):
                        tainted.update(x for x in (op.results[k:k + 1] + loop.args[k + 1:k + 2]))
            elif op.name == "scf.while" and len(op.regions) == 2:
                first, then = op.regions
                out, cond = yields(then), yields(first)
                for k, init in enumerate(op.operands):
                    if init in tainted or (k < len(out) and out[k] in tainted):
                        tainted.update(first.args[k:k + 1])
                for j, fwd in enumerate(cond[1:]):
                    if fwd in tainted:
                        tainted.update(then.args[j:j + 1] + op.results[j:j + 1])
            elif not op.regions and any(v in tainted for v in op.operands):
                tainted.update(op.results)
        if (len(tainted), stored) == before:
            break
    found = set()
    for op in ops:
        if op.name == "scf.while" and len(op.regions) == 2:
            control = yields(op.regions[0])[:1]
        else:
            control = _control_operands(op)
        if any(v in tainted for v in control):
            found.update(i for i in (op.item, op.else_item) if i >= 0)
    return found


def _decided_by(body: Body, decisions: set) -> set:
    """The items whose trip counts or predicates depend on the body's decision ops numbered
    ``decisions``."""
    return _downstream(body, {r for op in _all_ops(body.region) if op.decision in decisions for r in op.results})


@functools.lru_cache(maxsize=64)
def _loaded(body: Body) -> frozenset:
    """The items whose trip counts or predicates depend on values the body loads
    (scalar-prefetch tables, scalars in SMEM). Cached: every evaluator of a body asks."""
    return frozenset(_downstream(body, {r for op in _all_ops(body.region) if op.name == "memref.load"
                                        for r in op.results}))


def data_items(call: CustomCall) -> set:
    """The loops and arms of the kernel of ``call`` whose trip counts or predicates depend on
    values it loads: on the inputs a time is priced on, they do what the program computed from
    those inputs."""
    body = parse_kernel(call).body
    return _loaded(body) if body is not None else frozenset()


def data_loops(call: CustomCall) -> set:
    """The loops among ``data_items``: no evaluation over the grid bounds them."""
    body = parse_kernel(call).body
    return {i for i in data_items(call) if body.items[i].kind == "loop"}


def _with_dependence(item: ControlItem, op: _Op | None) -> ControlItem:
    """A loop item marked ``dependent`` when a loop bound or predicate inside it reads its
    induction variable or carried values (then its iterations are evaluated one by one)."""
    if item.kind != "loop" or op is None:
        return item
    tainted = {a for r in op.regions for a in r.args}
    own_condition = op.regions[0].ops[-1] if op.name == "scf.while" and op.regions[0].ops else None
    for inner in (o for r in op.regions for o in _all_ops(r)):
        if inner is not own_condition and (any(v in tainted for v in _control_operands(inner)) or
                                           (inner.name == "scf.while" and any(v in tainted for v in inner.operands))):
            return replace(item, dependent=True)
        if any(v in tainted for v in inner.operands):
            tainted.update(inner.results)
            for r in inner.regions:
                tainted.update(r.args)
    return item


def _string(attr) -> str:
    s = str(attr)
    return s[1:-1] if s.startswith('"') else s


def _find_main(module):
    funcs = [op.operation for op in module.body.operations if _short(op.operation) == "func.func"]
    for op in funcs:
        if "scalar_prefetch" in op.attributes or "window_params" in op.attributes:
            return op, funcs
    if not funcs:
        raise ValueError("a Mosaic module without a function")
    return funcs[0], funcs


@functools.lru_cache(maxsize=64)
def _parse(body: bytes, operands: tuple, results: tuple, aliases: tuple) -> Kernel:
    ir = _mlir_ir()

    ctx, module = kernel_module(body)
    with ctx:
        main, funcs = _find_main(module)
        attrs = main.attributes
        name = _string(attrs["sym_name"]) if "sym_name" in attrs else "kernel"
        raw = ir.DenseI64ArrayAttr(attrs["iteration_bounds"]) if "iteration_bounds" in attrs else ()
        bounds = tuple(None if b == MLIR_DYNAMIC else int(b) for b in raw)
        semantics = tuple(re.sub(r"^#tpu\.dimension_semantics<(\w+)>$", r"\1", str(a))
                          for a in ir.ArrayAttr(attrs["dimension_semantics"])) \
            if "dimension_semantics" in attrs else ()
        n_prefetch = (_int_attr(attrs["scalar_prefetch"]) if "scalar_prefetch" in attrs else 0) or 0
        n_scratch = (_int_attr(attrs["scratch_operands"]) if "scratch_operands" in attrs else 0) or 0
        args = [a.type for a in main.regions[0].blocks[0].arguments]
        n_dynamic = sum(b is None for b in bounds)
        n_inputs = len(operands) - n_dynamic - n_prefetch
        refs = args[len(bounds) + n_prefetch:len(args) - n_scratch]
        if n_inputs < 0 or len(refs) != n_inputs + len(results):
            raise ValueError(f"kernel {name}: {len(refs)} operand refs for {n_inputs} inputs and "
                             f"{len(results)} outputs")
        params = [ir.DictAttr(a) for a in ir.ArrayAttr(attrs["window_params"])] if "window_params" in attrs else None
        if params is not None and len(params) != len(refs):
            raise ValueError(f"kernel {name}: {len(params)} window_params for {len(refs)} operands")
        arrays = list(operands[len(operands) - n_inputs:]) + list(results)
        windows = []
        for i, (ref, (shape, dtype)) in enumerate(zip(refs, arrays)):
            info = _memref(ref)
            space = info[2] if info else "vmem"
            output = i >= n_inputs
            if params is None:  # no grid: every operand copied whole, once
                pipelined = space in ("vmem", "smem")
                windows.append(Window(i, output, tuple(shape), dtype, space, tuple(shape) if pipelined else None,
                                      1 if space == "vmem" else 2))
                continue
            p = params[i]
            if "window_bounds" not in p:
                windows.append(Window(i, output, tuple(shape), dtype, space, None))
                continue
            mode = str(p["pipeline_mode"]) if "pipeline_mode" in p else ""
            buffers = 1 if "synchronous" in mode else 2
            transform = ir.FlatSymbolRefAttr(p["transform_indices"]).value if "transform_indices" in p else None
            windows.append(Window(i, output, tuple(shape), dtype, space,
                                  tuple(int(d) for d in ir.DenseI64ArrayAttr(p["window_bounds"])), buffers,
                                  transform, "window_kind" in p and "element" in str(p["window_kind"])))
        scratch = []
        for t in args[len(args) - n_scratch:] if n_scratch else ():
            info = _memref(t)
            if info is not None:
                scratch.append(Scratch(*info))
        transforms = {}
        wanted = {w.transform for w in windows if w.transform}
        for f in funcs:
            fname = _string(f.attributes["sym_name"]) if "sym_name" in f.attributes else ""
            if fname in wanted:
                transforms[fname] = _transform(f)
        body = _body_ir(main)
        flops, vec, trans, dma = _body_work(body)
    return Kernel(name, bounds, semantics, tuple(operands[n_dynamic:n_dynamic + n_prefetch]), tuple(windows),
                  tuple(scratch), flops, vec, trans, dma, transforms, aliases, body)


def parse_kernel(call: CustomCall) -> Kernel:
    """The kernel of one ``tpu_custom_call``: grid, windows, scratch, body work, index maps."""
    return _parse(call.body, tuple(call.operands), tuple(call.results), tuple(call.aliases))


# --- index maps, evaluated over the grid ---------------------------------------------------


def _wrap(x, width: int):
    """``x`` as a signed integer of ``width`` bits (i1 as 0/1)."""
    if width >= 64:
        return x
    if width == 1:
        return x & 1
    half = 1 << (width - 1)
    return ((x + half) % (1 << width)) - half


def _unsigned(x, width: int):
    return x if width >= 64 else x & ((1 << width) - 1)


# arith.cmpi predicates: 0 eq, 1 ne, 2-5 signed lt/le/gt/ge, 6-9 the same unsigned.
_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal}
_AS_SIGNED = {6: 2, 7: 3, 8: 4, 9: 5}  # an unsigned comparison, where both sides are read unsigned
_OPERANDS_SWAPPED = {2: 4, 3: 5, 4: 2, 5: 3, 6: 8, 7: 9, 8: 6, 9: 7}  # a < b  <=>  b > a


def _divide(a, b, kind: str):
    if np.any(b == 0):
        return None
    if kind == "floor":
        return a // b
    if kind == "ceil":
        return -((-a) // b)
    q = np.abs(a) // np.abs(b)  # toward zero
    return np.where((a < 0) != (b < 0), -q, q)


def _scalar_op(name: str, args: list, attrs: dict, w: int, in_widths: tuple):
    """One integer op on exact values (numpy arrays or scalars), as the Mosaic body computes
    it; None for an op this evaluator does not know (or a division by zero, a shift out of
    range)."""
    out = None
    if name in ("arith.addi", "arith.subi", "arith.muli", "arith.andi", "arith.ori", "arith.xori",
                "arith.minsi", "arith.maxsi", "arith.shli", "arith.shrsi"):
        a, b = args
        if name in ("arith.shli", "arith.shrsi") and np.any((b < 0) | (b >= w)):
            return None
        out = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
               "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
               "arith.minsi": np.minimum, "arith.maxsi": np.maximum, "arith.shli": np.left_shift,
               "arith.shrsi": np.right_shift}[name](a, b)
    elif name in ("arith.minui", "arith.maxui"):
        a, b = (_unsigned(x, in_widths[0]) for x in args)
        out = np.minimum(a, b) if name == "arith.minui" else np.maximum(a, b)
    elif name == "arith.shrui":
        a, b = args
        if np.any((b < 0) | (b >= w)):
            return None
        out = np.right_shift(_unsigned(a, in_widths[0]), b)
    elif name in ("arith.divsi", "arith.floordivsi", "arith.ceildivsi"):
        out = _divide(args[0], args[1], {"arith.divsi": "trunc", "arith.floordivsi": "floor",
                                         "arith.ceildivsi": "ceil"}[name])
    elif name == "arith.remsi":
        q = _divide(args[0], args[1], "trunc")
        out = None if q is None else args[0] - q * args[1]
    elif name in ("arith.divui", "arith.remui"):
        a, b = (_unsigned(x, in_widths[0]) for x in args)
        if np.any(b == 0):
            return None
        out = a // b if name == "arith.divui" else a % b
    elif name == "arith.cmpi":
        pred = attrs.get("predicate")
        a, b = args
        if pred in _CMPI:
            out = _CMPI[pred](a, b)
        elif pred in _AS_SIGNED:
            a, b = _unsigned(a, in_widths[0]), _unsigned(b, in_widths[0])
            out = _CMPI[_AS_SIGNED[pred]](a, b)
        else:
            return None
        out = np.asarray(out, np.int64)
    elif name == "arith.select":
        c, a, b = args
        out = np.where(np.asarray(c) != 0, a, b)
    elif name == "math.absi":
        out = np.abs(args[0])
    elif name in ("arith.index_cast", "arith.extsi", "tpu.assume_multiple"):
        out = -args[0] if name == "arith.extsi" and in_widths[0] == 1 else args[0]
    elif name in ("arith.extui", "arith.index_castui"):
        out = _unsigned(args[0], in_widths[0])
    elif name == "arith.trunci":
        out = args[0]
    return out


# Integer ops that choose: which way each went is compared between the check and full size.
_DECISIONS = frozenset({"arith.cmpi", "arith.select", "arith.minsi", "arith.maxsi", "arith.minui", "arith.maxui"})


def _decides(name: str, operands: tuple, made: dict) -> bool:
    """Whether an op is a decision (``_DECISIONS``) to compare, ``made``: value id -> (the
    name, the constant value) of the op that defined it. A remainder tested against 0 is the
    sign correction jnp's ``//`` and ``%`` lower to, not a choice of the program's (whether
    n is a multiple of a block changes with n): the select it feeds is compared instead."""
    if name not in _DECISIONS:
        return False
    if name == "arith.cmpi" and len(operands) == 2:
        a, b = (made.get(v, (None, None)) for v in operands)
        if any(x[0] in ("arith.remsi", "arith.remui") and y == ("arith.constant", 0) for x, y in ((a, b), (b, a))):
            return False
    return True


def _sides(name: str, args: list, out, in_widths: tuple) -> dict:
    """Which way a decision op went, from its exact operands and result (``_scalar_op``'s):
    {side: where it went that way}. A comparison is "true" or "false", a select takes "then"
    or "else", a min or max takes its "first" or "second" operand (where the two differ: a
    tie takes neither)."""
    if name == "arith.cmpi":
        taken = np.asarray(out) != 0
        return {"true": taken, "false": ~taken}
    if name == "arith.select":
        taken = np.asarray(args[0]) != 0
        return {"then": taken, "else": ~taken}
    a, b = args
    if name in ("arith.minui", "arith.maxui"):  # their result is the unsigned operand
        a, b = _unsigned(a, in_widths[0]), _unsigned(b, in_widths[0])
    differ = a != b
    return {"first": differ & (out == a), "second": differ & (out == b)}


def evaluate_transform(t: Transform, points: np.ndarray, tables: list | None,
                       sides: dict | None = None) -> np.ndarray | None:
    """An index map at every grid point at once: (steps, n_results) int64, or None when it
    cannot be evaluated (an op this evaluator does not know, a table it reads without its
    value, a division by zero).

    ``points``: (steps, n_grid) grid indices; ``tables``: the scalar-prefetch operands'
    concrete values (the map's arguments after the grid indices), or None. A table read
    outside its bounds is clamped, as the jaxpr path's evaluation does. ``sides``, if given,
    collects which way each decision op of the map went ({op position: sides}, ``_sides``)."""
    try:
        return _evaluate(t, points, tables, sides)
    except EVALUATION_ERRORS:  # a malformed map: not evaluable
        return None


def _evaluate(t: Transform, points: np.ndarray, tables: list | None, sides: dict | None) -> np.ndarray | None:
    if not t.supported:
        return None
    steps, n_grid = points.shape
    env: dict = {("arg", i): points[:, i].astype(np.int64) for i in range(n_grid)}
    made: dict = {}
    for i in range(n_grid, t.n_args):
        j = i - n_grid
        env[("arg", i)] = ("table", j)
    with np.errstate(over="ignore"):
        for position, (name, results, operands, attrs, widths, in_widths) in enumerate(t.ops):
            if any(o is None for o in operands):
                return None
            args = [env.get(o) for o in operands]
            if any(a is None for a in args):
                return None  # the unused result of a multi-result op
            if name != "memref.load" and any(isinstance(a, tuple) for a in args):
                return None  # a table used as a number
            w = widths[0] if widths else 64
            if name == "arith.constant":
                if attrs.get("value") is None:
                    return None
                out = np.int64(attrs["value"])
            elif name == "func.return":
                if len(args) == 0:
                    return np.zeros((steps, 0), np.int64)
                return np.stack([np.broadcast_to(np.asarray(a, np.int64), (steps,)) for a in args], axis=1)
            elif name == "memref.load":
                ref, *idx = args
                if not (isinstance(ref, tuple) and ref[0] == "table"):
                    return None
                if tables is None or ref[1] >= len(tables):
                    return None
                table = np.asarray(tables[ref[1]])
                if table.dtype.kind not in "iub" or len(idx) != table.ndim:
                    return None
                idx = [np.clip(np.asarray(x, np.int64), 0, max(d - 1, 0)) for x, d in zip(idx, table.shape)]
                out = table[tuple(idx)].astype(np.int64) if table.size else None
            else:
                out = _scalar_op(name, args, attrs, w, in_widths)
                if sides is not None and out is not None and _decides(name, operands, made):
                    sides.setdefault(position, set()).update(
                        side for side, where in _sides(name, args, out, in_widths).items() if np.any(where))
            if out is None:
                return None
            env[results[0]] = _wrap(np.asarray(out, np.int64), w)
            made[results[0]] = (name, attrs.get("value"))
    return None  # no func.return


# --- trip counts and branches at every grid step --------------------------------------------

MAX_TRIPS = 1 << 24  # a loop bound above this per grid step is no bound at all
_SIM_TRIPS = 1024  # a loop is evaluated iteration by iteration up to this many iterations
_SIM_BUDGET = 4e6  # grid elements x iterations a kernel's iteration-by-iteration evaluation may take
_GUARD = 32  # bundles a guard branch may hold around the loop it skips


def _full(w: int) -> tuple:
    """The interval of an integer of ``w`` bits nothing is known about (index: as i32)."""
    if w == 1:
        return (0, 1)
    if w <= 0 or w > 32:
        w = 32
    return (-(1 << (w - 1)), (1 << (w - 1)) - 1)


def _exact(v) -> bool:
    return v[0] is v[1]


def _tight(lo, hi) -> tuple:
    """An interval, marked exact (one array for both bounds) where its bounds agree."""
    return (lo, lo) if np.array_equal(lo, hi) else (lo, hi)


def _wrapped(x, w: int) -> tuple:
    x = _wrap(np.asarray(x, np.int64), w)
    return (x, x)


def _norm(lo, hi, w: int) -> tuple:
    """An interval kept inside its type: bounds that overflow it widen to the whole type."""
    mn, mx = _full(w)
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    bad = (lo < mn) | (hi > mx)
    if np.any(bad):
        lo, hi = np.where(bad, mn, lo), np.where(bad, mx, hi)
    return (lo, hi)


def _cmp_interval(pred: int, a: tuple, b: tuple):
    """(lo, hi) of a comparison of two intervals: 1 where certainly true, 0 where certainly
    false, [0, 1] where it depends on values inside them."""
    if pred in _AS_SIGNED:  # unsigned: as signed where both sides are non-negative
        if np.any(a[0] < 0) or np.any(b[0] < 0):
            return None
        pred = _AS_SIGNED[pred]
    (alo, ahi), (blo, bhi) = a, b
    if pred == 0 or pred == 1:  # eq, ne
        true = (alo == ahi) & (blo == bhi) & (alo == blo)
        false = (ahi < blo) | (alo > bhi)
        if pred == 1:
            true, false = false, true
    elif pred == 2:  # a < b
        true, false = ahi < blo, alo >= bhi
    elif pred == 3:  # a <= b
        true, false = ahi <= blo, alo > bhi
    elif pred == 4:  # a > b
        true, false = alo > bhi, ahi <= blo
    elif pred == 5:  # a >= b
        true, false = alo >= bhi, ahi < blo
    else:
        return None
    return (np.asarray(true, np.int64), np.asarray(~np.asarray(false), np.int64))


def _interval_op(name: str, args: list, attrs: dict, w: int, in_w: tuple):
    """One integer op on intervals (lo, hi), at least one of them not exact: a sound
    interval of its result, or None when nothing better than its type's range is known."""
    if name in ("arith.index_cast", "arith.trunci", "tpu.assume_multiple"):
        return args[0]
    if name == "arith.extsi":
        lo, hi = args[0]
        return (-hi, -lo) if in_w[0] == 1 else (lo, hi)
    if name in ("arith.extui", "arith.index_castui"):
        return args[0] if np.all(args[0][0] >= 0) else None
    if name == "arith.select":
        (clo, chi), (alo, ahi), (blo, bhi) = args
        lo = np.where(clo >= 1, alo, np.where(chi <= 0, blo, np.minimum(alo, blo)))
        hi = np.where(clo >= 1, ahi, np.where(chi <= 0, bhi, np.maximum(ahi, bhi)))
        return (lo, hi)
    if name == "math.absi":
        lo, hi = args[0]
        return (np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0)), np.maximum(np.abs(lo), np.abs(hi)))
    if name == "arith.cmpi":
        return _cmp_interval(attrs.get("predicate"), args[0], args[1])
    if len(args) != 2:
        return None
    (alo, ahi), (blo, bhi) = args
    if name == "arith.addi":
        return (alo + blo, ahi + bhi)
    if name == "arith.subi":
        return (alo - bhi, ahi - blo)
    if name == "arith.muli":
        c = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return (np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3])),
                np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3])))
    if name in ("arith.minsi", "arith.minui"):
        if name == "arith.minui" and (np.any(alo < 0) or np.any(blo < 0)):
            return None
        return (np.minimum(alo, blo), np.minimum(ahi, bhi))
    if name in ("arith.maxsi", "arith.maxui"):
        if name == "arith.maxui" and (np.any(alo < 0) or np.any(blo < 0)):
            return None
        return (np.maximum(alo, blo), np.maximum(ahi, bhi))
    if name in ("arith.divsi", "arith.floordivsi", "arith.ceildivsi", "arith.divui"):
        if np.any((blo <= 0) & (bhi >= 0)) or (name == "arith.divui" and np.any(alo < 0)):
            return None  # a divisor that may be zero (or a negative unsigned value)
        kind = {"arith.divsi": "trunc", "arith.floordivsi": "floor", "arith.ceildivsi": "ceil",
                "arith.divui": "floor"}[name]
        c = [_divide(x, y, kind) for x in (alo, ahi) for y in (blo, bhi)]
        return (np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3])),
                np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3])))
    if name in ("arith.remsi", "arith.remui"):
        if np.any((blo <= 0) & (bhi >= 0)):
            return None
        m = np.maximum(np.abs(blo), np.abs(bhi)) - 1
        if name == "arith.remui" or np.all(alo >= 0):
            if name == "arith.remui" and np.any(alo < 0):
                return None
            return (np.zeros_like(m), np.minimum(m, np.maximum(ahi, 0)))
        return (np.where(alo >= 0, 0, -m), np.where(ahi <= 0, 0, m))
    if name == "arith.andi":
        if w == 1:
            return (alo & blo, ahi & bhi)
        if np.all(blo >= 0) and _exact((blo, bhi)):
            return (np.zeros_like(bhi), np.where(alo >= 0, np.minimum(ahi, bhi), bhi))
        if np.all(alo >= 0) and _exact((alo, ahi)):
            return (np.zeros_like(ahi), np.where(blo >= 0, np.minimum(bhi, ahi), ahi))
        return None
    if name in ("arith.ori", "arith.xori") and w == 1:
        if name == "arith.ori":
            return (alo | blo, ahi | bhi)
        return (np.where((alo == ahi) & (blo == bhi), alo ^ blo, 0), np.where((alo == ahi) & (blo == bhi), alo ^ blo, 1))
    if name in ("arith.shrsi", "arith.shrui") and _exact((blo, bhi)) and np.all((blo >= 0) & (blo < 32)):
        if name == "arith.shrui" and np.any(alo < 0):
            return None
        return (alo >> blo, ahi >> blo)
    if name == "arith.shli" and _exact((blo, bhi)) and np.all((blo >= 0) & (blo < 32)):
        return (alo << blo, ahi << blo)
    return None


class _Abort(Exception):
    """An iteration-by-iteration evaluation that cannot go on (a condition it cannot decide,
    too many iterations): the loop is bounded instead."""


@dataclass
class ControlCounts:
    """How often each loop body and branch side of a kernel body runs at each grid step, and
    the body's work.

    ``mult[item]``: iterations of a loop, or runs of a branch side, per grid step (arrays
    broadcastable to the grid's shape, or numbers), counting every enclosing loop;
    ``entries[item]``: how often a loop is entered with at least one iteration. ``bounds``:
    loops priced at an upper bound (its largest value); ``uncertain``: branch sides whose
    predicate could not be evaluated (charged wherever the branch is reached). ``work``:
    (MXU flops, vector ops, transcendentals) per grid step on average; ``dma``: bytes of
    hand-issued DMAs per grid step (broadcastable); ``dma_groups``: how many groups of DMAs
    the body issues per grid step (copies started one after another count once; broadcastable);
    ``waited_dma`` and ``waited_groups``: the same for copies waited for right after they start.
    ``patterns``: what each item did over the reached steps ("runs", "skipped": an arm not
    taken or a loop of no trips, "varies": a loop's trip count differing between steps,
    ``("fewest", n)``: the fewest trips a loop ran at a step), and
    under ``("decision", k)`` the sides the body's k-th decision op took (``_sides``, if asked), for
    comparing the grid a check ran with the full-size one (``unseen_items``); ``unchecked``:
    items priced at an upper bound because the check never saw what they do at full size."""

    grid: tuple
    mult: dict = field(default_factory=dict)
    entries: dict = field(default_factory=dict)
    max_trips: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    uncertain: set = field(default_factory=set)
    work: list = field(default_factory=lambda: [0.0, 0.0, 0.0])
    dma: object = 0.0
    dma_groups: object = 0.0
    waited_dma: object = 0.0
    waited_groups: object = 0.0
    patterns: dict = field(default_factory=dict)
    unchecked: set = field(default_factory=set)

    def flat(self, value) -> np.ndarray:
        """A per-step quantity as one value per grid step, in the order the grid runs."""
        steps = math.prod(self.grid) if self.grid else 1
        return np.broadcast_to(np.asarray(value, np.float64), self.grid).reshape(steps)

    def notes(self, kernel: str, items: tuple) -> list[str]:
        out = [f"kernel {kernel}: {items[i].label} has a trip count that depends on data the kernel loads "
               f"(or on ops the simulator does not evaluate): priced at its upper bound, {n} per grid step"
               for i, n in sorted(self.bounds.items())]
        arms = sorted({items[i].label.split(" (")[0] for i in self.uncertain})
        if arms:
            out.append(f"kernel {kernel}: the predicate of {', '.join(arms)} depends on data the kernel loads "
                       "(or on ops the simulator does not evaluate): both sides charged wherever reached")
        unchecked = sorted({items[i].label.split(" (")[0] for i in self.unchecked})
        if unchecked:
            out.append(f"kernel {kernel}: {', '.join(unchecked)} behaves at full size in a way the check-size run "
                       "never showed (a side it never took, a loop it never skipped, whose trip count never "
                       "varied or never went so low, a bound or predicate deciding a way it never did), so the "
                       "check did not verify it "
                       "there: charged wherever reached, loops at their largest trip count")
        return out


class _Evaluator:
    """Walks a kernel body over the whole grid at once (values are arrays shaped to broadcast
    against the grid: a value of the grid indices of two axes has two non-unit dimensions),
    on intervals of integers, counting the work and the runs of each loop and branch."""

    def __init__(self, kernel: Kernel, grid: tuple, tables: list | None, state: dict | None = None,
                 unseen: frozenset = frozenset(), decisions: bool = False):
        self.kernel, self.body, self.grid = kernel, kernel.body, tuple(grid)
        self.unseen = unseen  # items whose full-size behaviour the check never saw: priced at a bound
        self.decisions = decisions  # record the sides decision ops take (for comparing sizes, not pricing)
        # A loop's fewest trips is compared between sizes only where no loaded value sets them:
        # the check's inputs are drawn apart from the priced ones, so data-set counts differ anyway.
        self.loaded = _loaded(self.body) if decisions else frozenset()
        self.tables = tables
        self.counts = ControlCounts(self.grid)
        self.budget = _SIM_BUDGET
        n_grid = len(kernel.iteration_bounds)
        # Tables the body stores into: their values carry from step to step. ``state``: each
        # stored element's value at the start of each step ((table, index) -> interval), or
        # None when it is not known (then every load from those tables is unknown).
        self.written = {j for j in range(len(kernel.prefetch)) if n_grid + j in self.body.written}
        self.smem = dict(state) if state is not None else None
        self.certain = True  # False inside a branch side or loop that may not run
        self.lost = False  # a store the evaluation could not follow (an index not known)

    def run(self) -> ControlCounts:
        env: dict = {}
        ndim = len(self.grid)
        n_grid = len(self.kernel.iteration_bounds)
        for i in range(min(n_grid, ndim)):
            shape = [1] * ndim
            shape[i] = self.grid[i]
            a = np.arange(self.grid[i], dtype=np.int64).reshape(shape)
            env[i] = (a, a)
        for j in range(len(self.kernel.prefetch)):
            if self.tables is not None and j < len(self.tables) and (j not in self.written or self.smem is not None):
                env[n_grid + j] = ("table", j, ())
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self.walk(self.body.region, env, 1.0)
        return self.counts

    # --- bookkeeping ---

    def _add(self, table: dict, item: int, value) -> None:
        if item >= 0:
            table[item] = table.get(item, 0.0) + value

    def _size(self, value) -> int:
        return int(np.size(value)) if isinstance(value, np.ndarray) else 1

    def _reached(self, weight):
        return np.asarray(weight) > 0

    def _snapshot(self):
        c = self.counts
        return (dict(c.mult), dict(c.entries), dict(c.max_trips), dict(c.bounds), set(c.uncertain), list(c.work), c.dma,
                c.dma_groups, c.waited_dma, c.waited_groups, {k: set(v) for k, v in c.patterns.items()},
                set(c.unchecked), dict(self.smem) if self.smem is not None else None, self.lost)

    def _restore(self, snap) -> None:
        c = self.counts
        (c.mult, c.entries, c.max_trips, c.bounds, c.uncertain, c.work, c.dma, c.dma_groups, c.waited_dma,
         c.waited_groups, c.patterns, c.unchecked, self.smem, self.lost) = snap

    def _pattern(self, item: int, runs, weight, loop: bool) -> None:
        """Add what ``item`` did at the reached steps (``runs``: its runs or trips per step)."""
        if item < 0:
            return
        reached, runs = np.broadcast_arrays(self._reached(weight), np.asarray(runs, np.float64))
        seen = runs[reached]
        if not seen.size:
            return
        found = self.counts.patterns.setdefault(item, set())
        if np.any(seen > 0):
            found.add("runs")
        if np.any(seen == 0):
            found.add("skipped")
        if loop and seen.min() != seen.max():
            found.add("varies")
        if loop and self.decisions and item not in self.loaded:
            found.add(("fewest", float(seen.min())))

    def _decided(self, op: _Op, sides: dict, weight) -> None:
        """Add the sides a decision op took at the reached steps (``patterns[("decision", k)]``)."""
        reached = self._reached(weight)
        found = self.counts.patterns.setdefault(("decision", op.decision), set())
        for side, where in sides.items():
            if np.any(np.logical_and(where, reached)):
                found.add(side)

    # --- the walk ---

    def walk(self, region: _Region, env: dict, weight) -> list:
        w = region.work
        if w[0] or w[1] or w[2]:
            mean = float(np.mean(weight))
            c = self.counts.work
            c[0] += w[0] * mean
            c[1] += w[1] * mean
            c[2] += w[2] * mean
        if w[3]:
            self.counts.dma = self.counts.dma + w[3] * np.asarray(weight, np.float64)
        if w[4]:
            self.counts.dma_groups = self.counts.dma_groups + w[4] * np.asarray(weight, np.float64)
        if w[5]:
            self.counts.waited_dma = self.counts.waited_dma + w[5] * np.asarray(weight, np.float64)
        if w[6]:
            self.counts.waited_groups = self.counts.waited_groups + w[6] * np.asarray(weight, np.float64)
        needed = self.body.needed
        for op in region.ops:
            name = op.name
            if name == "scf.if":
                self._if(op, env, weight)
            elif name == "scf.for":
                self._for(op, env, weight)
            elif name == "scf.while":
                self._while(op, env, weight)
            elif name in ("scf.yield", "scf.condition", "tpu.yield"):
                return [env.get(v) for v in op.operands]
            elif name == "memref.store":
                self._store(op, env, weight)
            elif op.regions:
                for sub in op.regions:
                    self.walk(sub, env, weight)
                for r, wd in zip(op.results, op.widths):
                    env[r] = _full(wd) if wd else None
            elif op.results and any(r in needed for r in op.results):
                env[op.results[0]] = self._scalar(op, env, weight)
        return []

    def _value(self, env: dict, v, w: int = 32):
        """An operand as an interval (its type's range when unknown)."""
        x = env.get(v)
        return x if isinstance(x, tuple) and len(x) == 2 else _full(w)

    def _scalar(self, op: _Op, env: dict, weight=1.0):
        name, w = op.name, (op.widths[0] if op.widths else 0)
        if name == "arith.constant":
            value = op.attrs.get("value")
            return _wrapped(value, w) if value is not None and w else None
        if name == "tpu.iteration_bound":
            d = op.attrs.get("dimension")
            return _wrapped(self.grid[d], w or 32) if d is not None and 0 <= d < len(self.grid) else _full(w)
        if name in ("tpu.memref_slice", "tpu.memref_reshape", "tpu.memref_bitcast"):
            ref = env.get(op.operands[0]) if op.operands else None
            if name == "tpu.memref_slice" and isinstance(ref, tuple) and len(ref) == 3:
                offsets = [env.get(v) for v in op.operands[1:]]
                if all(isinstance(o, tuple) and len(o) == 2 and _exact(o) for o in offsets):
                    base = list(ref[2]) or [0] * len(offsets)
                    if len(base) == len(offsets):
                        return ("table", ref[1], tuple(b + o[0] for b, o in zip(base, offsets)))
            return None
        if not w:
            return None
        if name == "memref.load":
            return self._load(op, env, w)
        args = [env.get(v) for v in op.operands]
        if not args or any(not (isinstance(a, tuple) and len(a) == 2) for a in args):
            return _full(w)
        if all(_exact(a) for a in args):
            values = [a[0] for a in args]
            out = _scalar_op(name, values, op.attrs, w, op.in_widths)
            if self.decisions and op.decision >= 0 and out is not None:
                self._decided(op, _sides(name, values, out, op.in_widths), weight)
            return _wrapped(out, w) if out is not None else _full(w)
        out = _interval_op(name, args, op.attrs, w, op.in_widths)
        return _norm(out[0], out[1], w) if out is not None else _full(w)

    def _load(self, op: _Op, env: dict, w: int):
        ref = env.get(op.operands[0])
        if not (isinstance(ref, tuple) and len(ref) == 3 and self.tables is not None):
            return _full(w)  # VMEM, SMEM scratch, or a table the kernel writes
        table = np.asarray(self.tables[ref[1]])
        idx = [self._value(env, v) for v in op.operands[1:]]
        if ref[2]:
            if len(ref[2]) != len(idx):
                return _full(w)
            idx = [(i[0] + o, i[1] + o) for i, o in zip(idx, ref[2])]
        if table.dtype.kind not in "iub" or not table.size or len(idx) != table.ndim:
            return _full(w)
        if ref[1] in self.written:
            key = self._element(ref[1], idx, table)
            if key is None:
                return _full(w)
            found = self.smem.get(key)
            return found if found is not None else _wrapped(table[key[1]], w)
        if all(_exact(i) for i in idx):
            pos = tuple(np.clip(np.asarray(i[0], np.int64), 0, max(d - 1, 0)) for i, d in zip(idx, table.shape))
            return _wrapped(table[pos].astype(np.int64), w)
        return (np.int64(table.min()), np.int64(table.max()))

    def _element(self, j: int, idx: list, table) -> tuple | None:
        """(table, index) of an element read or written at the same index at every step."""
        if not all(_exact(i) and np.size(i[0]) == 1 for i in idx):
            return None
        pos = tuple(int(np.clip(int(np.asarray(i[0]).reshape(-1)[0]), 0, max(d - 1, 0)))
                    for i, d in zip(idx, table.shape))
        return (j, pos)

    def _store(self, op: _Op, env: dict, weight) -> None:
        if op.operands[0] not in self.body.needed:
            return  # a value no loop bound or predicate reads back
        ref = env.get(op.operands[1]) if len(op.operands) > 1 else None
        if not (isinstance(ref, tuple) and len(ref) == 3 and ref[1] in self.written and self.smem is not None):
            return
        table = np.asarray(self.tables[ref[1]])
        idx = [self._value(env, v) for v in op.operands[2:]]
        if ref[2]:
            idx = [(i[0] + o, i[1] + o) for i, o in zip(idx, ref[2])] if len(ref[2]) == len(idx) else []
        key = self._element(ref[1], idx, table) if len(idx) == table.ndim and table.size else None
        if key is None:
            self.lost = True
            return
        value = self._value(env, op.operands[0], op.in_widths[0] if op.in_widths else 32)
        old = self.smem.get(key)
        if old is None:
            old = _wrapped(table[key[1]], op.in_widths[0] if op.in_widths else 32)
        reached = self._reached(weight)
        if self.certain:
            lo, hi = np.where(reached, value[0], old[0]), np.where(reached, value[1], old[1])
        else:  # it may not have run: either value
            lo = np.where(reached, np.minimum(value[0], old[0]), old[0])
            hi = np.where(reached, np.maximum(value[1], old[1]), old[1])
        self.smem[key] = _tight(lo, hi)

    def _uncertainly(self, fn, *args):
        """``fn(*args)`` for a region that may or may not run where reached."""
        was, self.certain = self.certain, False
        try:
            return fn(*args)
        finally:
            self.certain = was

    def _if(self, op: _Op, env: dict, weight) -> None:
        c = self._value(env, op.operands[0], 1)
        forced = op.item in self.unseen or op.else_item in self.unseen
        if forced:  # both sides, wherever reached
            self.counts.unchecked.update(i for i in (op.item, op.else_item) if i >= 0)
            c = (np.zeros_like(np.asarray(c[0])), np.ones_like(np.asarray(c[1])))
        lo, hi = np.asarray(c[0]), np.asarray(c[1])
        w_then = weight * (hi >= 1)
        w_else = weight * (lo <= 0)
        self._pattern(op.item, hi >= 1, weight, loop=False)
        self._pattern(op.else_item, lo <= 0, weight, loop=False)
        if not forced and not _exact(c) and np.any((lo != hi) & self._reached(weight)):
            self.counts.uncertain.update((op.item, op.else_item))
        self._add(self.counts.mult, op.item, w_then)
        self._add(self.counts.mult, op.else_item, w_else)
        walk = self.walk if _exact(c) or np.all(lo == hi) else functools.partial(self._uncertainly, self.walk)
        then = walk(op.regions[0], env, w_then)
        other = walk(op.regions[1], env, w_else) if len(op.regions) > 1 else []
        for k, (r, wd) in enumerate(zip(op.results, op.widths)):
            if r not in self.body.needed or not wd:
                env[r] = _full(wd) if wd else None
                continue
            a = then[k] if k < len(then) else None
            b = other[k] if k < len(other) else None
            if isinstance(a, tuple) and len(a) == 2 and isinstance(b, tuple) and len(b) == 2:
                env[r] = _norm(*_interval_op("arith.select", [(lo, hi), a, b], {}, wd, ()), wd)
            else:
                env[r] = _full(wd)

    def _check_bound(self, op: _Op, trips_hi, weight) -> None:
        if np.any((trips_hi > MAX_TRIPS) & self._reached(weight)):
            raise Unpriceable(
                f"kernel {self.kernel.name}: {self.body.items[op.item].label} has no upper bound on its trip "
                "count: it depends on data the kernel loads (or on ops the simulator does not evaluate) with "
                "nothing that caps it; bound the loop (e.g. jnp.minimum with a constant) to have it priced")

    def _record(self, op: _Op, trips, exact: bool, weight) -> None:
        self._pattern(op.item, trips, weight, loop=True)
        c = self.counts
        self._add(c.mult, op.item, weight * trips)
        self._add(c.entries, op.item, weight * (trips > 0))
        reached = self._reached(weight)
        top = float(np.max(np.where(reached, trips, 0))) if np.any(reached) else 0.0
        c.max_trips[op.item] = max(c.max_trips.get(op.item, 0.0), top)
        if not exact and top > 0:
            c.bounds[op.item] = max(c.bounds.get(op.item, 0), int(top))

    def _for(self, op: _Op, env: dict, weight) -> None:
        lo, hi, step = (self._value(env, v, wd) for v, wd in zip(op.operands[:3], op.in_widths[:3]))
        body = op.regions[0]
        inits = [env.get(v) for v in op.operands[3:]]
        item = self.body.items[op.item]
        if item.static_trip is not None:
            trips_hi = trips_lo = np.asarray(item.static_trip)
        elif not _exact(step) or np.any(np.asarray(step[0]) <= 0):
            trips_hi = np.asarray(MAX_TRIPS + 1)
            trips_lo = np.asarray(0)
        else:
            s = step[0]
            trips_hi = np.maximum(0, -((lo[0] - hi[1]) // s))
            trips_lo = np.maximum(0, -((lo[1] - hi[0]) // s))
        self._check_bound(op, trips_hi, weight)
        exact = (_exact(lo) and _exact(hi)) or bool(np.array_equal(trips_lo, trips_hi))
        if op.item in self.unseen:
            trips_hi = trips_lo = self._most(trips_hi, weight)
            self.counts.unchecked.add(op.item)
        trips = trips_hi
        top = int(np.max(trips)) if np.size(trips) else 0
        if item.dependent and exact and top <= _SIM_TRIPS and _exact(lo):
            cost = top * self._size(weight * trips)
            if cost <= self.budget:
                self.budget -= cost
                self._record(op, trips, True, weight)
                carried = list(inits)
                for t in range(top):
                    active = trips > t
                    wt = weight * active
                    iv = lo[0] + t * step[0]
                    env[body.args[0]] = (iv, iv)
                    for a, v in zip(body.args[1:], carried):
                        env[a] = v
                    ys = self.walk(body, env, wt)
                    carried = [self._merge(active, y, old) for y, old in zip(ys, carried)]
                for r, v in zip(op.results, carried):
                    env[r] = v
                return
        self._record(op, trips, exact, weight)
        if body.args:
            if _exact(step):
                last = lo[1] + np.maximum(trips - 1, 0) * step[0]
                env[body.args[0]] = _norm(lo[0], np.maximum(lo[1], last), op.in_widths[0] if op.in_widths else 32)
            else:
                env[body.args[0]] = _full(op.in_widths[0] if op.in_widths else 32)
        ys_pass = self._passthrough(body)
        for k, a in enumerate(body.args[1:]):
            env[a] = inits[k] if k in ys_pass and k < len(inits) else self._unknown_like(inits[k] if k < len(inits) else None)
        (self.walk if exact else functools.partial(self._uncertainly, self.walk))(body, env, weight * trips)
        for k, r in enumerate(op.results):
            env[r] = inits[k] if k in ys_pass and k < len(inits) else self._unknown_like(inits[k] if k < len(inits) else None)

    def _most(self, trips, weight):
        """A loop's largest trip count over the reached steps, as its count at every step."""
        reached, trips = np.broadcast_arrays(self._reached(weight), np.asarray(trips))
        return np.asarray(trips[reached].max() if np.any(reached) else 0)

    def _top_up(self, op: _Op, env: dict, weight, trips) -> None:
        """Charge a while loop in ``unseen`` the iterations it would run if it ran its largest
        trip count at every reached step, beyond the ``trips`` it was charged."""
        extra = np.maximum(self._most(trips, weight) - np.asarray(trips), 0)
        if not np.any(extra * self._reached(weight)):
            return
        self.counts.unchecked.add(op.item)
        self._add(self.counts.mult, op.item, weight * extra)
        self._add(self.counts.entries, op.item, weight * ((np.asarray(trips) == 0) & (extra > 0)))
        before, after = op.regions[0], op.regions[1]
        for a in (*before.args, *after.args):
            env[a] = self._unknown_like(env.get(a))
        self._uncertainly(self.walk, before, env, weight * extra)
        self._uncertainly(self.walk, after, env, weight * extra)

    def _passthrough(self, body: _Region) -> set:
        """Carried values a loop body yields unchanged."""
        if not body.ops or body.ops[-1].name != "scf.yield":
            return set()
        return {k for k, v in enumerate(body.ops[-1].operands) if k + 1 < len(body.args) and v == body.args[k + 1]}

    def _unknown_like(self, v):
        return _full(32) if isinstance(v, tuple) and len(v) == 2 else None

    def _merge(self, active, new, old):
        """A carried value after an iteration that ran where ``active``."""
        if isinstance(new, tuple) and len(new) == 2 and isinstance(old, tuple) and len(old) == 2:
            if np.all(active):
                return new
            lo, hi = np.where(active, new[0], old[0]), np.where(active, new[1], old[1])
            return (lo, lo) if _exact(new) and _exact(old) else (lo, hi)
        return new if np.all(active) else self._unknown_like(new if new is not None else old)

    def _while(self, op: _Op, env: dict, weight) -> None:
        before, after = op.regions[0], op.regions[1]
        inits = [env.get(v) for v in op.operands]
        needed = self.body.needed
        if all(_exact(v) for a, v in zip(before.args, inits) if a in needed and isinstance(v, tuple)) and \
                all(isinstance(v, tuple) for a, v in zip(before.args, inits) if a in needed):
            snap = self._snapshot()
            try:
                self._simulate_while(op, env, weight, inits)
                return
            except _Abort:
                self._restore(snap)
        trips = self._while_bound(op, env, inits)
        self._check_bound(op, trips, weight)
        if op.item in self.unseen:
            trips = self._most(trips, weight)
            self.counts.unchecked.add(op.item)
        self._record(op, trips, False, weight)
        for a, v in zip(before.args, inits):
            env[a] = self._unknown_like(v)
        cond = self._uncertainly(self.walk, before, env, weight * (trips + 1))
        for a, v in zip(after.args, cond[1:]):
            env[a] = self._unknown_like(v)
        self._uncertainly(self.walk, after, env, weight * trips)
        for r, wd in zip(op.results, op.widths):
            env[r] = _full(wd) if wd else None

    def _simulate_while(self, op: _Op, env: dict, weight, inits: list) -> None:
        before, after = op.regions[0], op.regions[1]
        carried = list(inits)
        active = self._reached(weight)
        trips = np.zeros(np.shape(active), np.int64)
        results = None
        for _ in range(_SIM_TRIPS + 1):
            self.budget -= self._size(active)
            if self.budget < 0:
                raise _Abort
            for a, v in zip(before.args, carried):
                env[a] = v
            cond = self.walk(before, env, weight * active)
            c = cond[0] if cond else None
            if not (isinstance(c, tuple) and len(c) == 2):
                raise _Abort
            if np.any((np.asarray(c[0]) != np.asarray(c[1])) & active):
                raise _Abort  # the condition depends on what the evaluation does not know
            go = active & (np.asarray(c[0]) >= 1)
            stop = active & ~go
            fwd = cond[1:]
            results = fwd if results is None else [self._merge(stop, f, r) for f, r in zip(fwd, results)]
            if not np.any(go):
                trips = trips.astype(np.float64)
                self._record(op, trips, True, weight)
                if op.item in self.unseen:
                    self._top_up(op, env, weight, trips)
                for r, v in zip(op.results, results):
                    env[r] = v
                return
            trips = trips + go
            for a, v in zip(after.args, fwd):
                env[a] = v
            ys = self.walk(after, env, weight * go)
            carried = [self._merge(go, y, old) for y, old in zip(ys, carried)]
            active = go
        raise _Abort

    def _while_bound(self, op: _Op, env: dict, inits: list):
        """An upper bound on a while loop's trips from its condition: a comparison (or a
        conjunction of comparisons) of a carried value stepped by a constant each iteration
        against a value that does not change in the loop. Infinity where none is found."""
        before, after = op.regions[0], op.regions[1]
        defs = {r: o for o in before.ops for r in o.results}
        adefs = {r: o for o in after.ops for r in o.results}
        cond = before.ops[-1] if before.ops and before.ops[-1].name == "scf.condition" else None
        if cond is None or not cond.operands:
            return np.asarray(float(MAX_TRIPS + 1))
        inside = {r for reg in op.regions for o in _all_ops(reg) for r in o.results} | \
            {a for reg in op.regions for a in reg.args}
        yields = after.ops[-1].operands if after.ops and after.ops[-1].name == "scf.yield" else ()
        # after-block argument j is the condition's forwarded operand j
        fwd_arg = {v: after.args[j] for j, v in enumerate(cond.operands[1:]) if j < len(after.args)}

        def strip(v):
            while v in defs and defs[v].name in ("arith.index_cast", "arith.extsi", "tpu.assume_multiple"):
                v = defs[v].operands[0]
            return v

        def step_of(k: int):
            arg = before.args[k]
            a = fwd_arg.get(arg)
            if a is None or k >= len(yields):
                return None
            y = yields[k]
            o = adefs.get(y)
            if o is None or o.name not in ("arith.addi", "arith.subi"):
                return None
            x, c = o.operands
            if o.name == "arith.addi" and c == a:
                x, c = c, x
            if x != a:
                return None
            cv = adefs.get(c)
            value = cv.attrs.get("value") if cv is not None and cv.name == "arith.constant" else None
            if value is None and c not in inside:
                v = env.get(c)
                value = int(v[0]) if isinstance(v, tuple) and _exact(v) and np.size(v[0]) == 1 else None
            if value is None:
                return None
            return value if o.name == "arith.addi" else -value

        def bound(v):
            o = defs.get(v)
            if o is None:
                return None
            if o.name == "arith.andi":
                found = [b for b in (bound(x) for x in o.operands) if b is not None]
                return functools.reduce(np.minimum, found) if found else None
            if o.name != "arith.cmpi":
                return None
            pred = o.attrs.get("predicate")
            a, b = (strip(x) for x in o.operands)
            if b in before.args and a not in before.args:
                a, b = b, a
                pred = _OPERANDS_SWAPPED.get(pred)
            if a not in before.args or b in inside and not (b in defs and defs[b].name == "arith.constant"):
                return None
            k = before.args.index(a)
            step = step_of(k)
            if step is None or step == 0 or k >= len(inits):
                return None
            if b in defs:
                limit = _wrapped(defs[b].attrs.get("value"), 32)
            else:
                limit = self._value(env, b)
            start = inits[k] if isinstance(inits[k], tuple) else _full(32)
            if pred in _AS_SIGNED:  # unsigned: as signed only where both sides are non-negative
                if np.any(np.asarray(limit[0]) < 0) or np.any(np.asarray(start[0]) < 0):
                    return None
                pred = _AS_SIGNED[pred]
            if step > 0 and pred in (2, 3):  # x < limit, x <= limit
                return np.maximum(0, -((start[0] - limit[1] - (pred == 3)) // step))
            if step < 0 and pred in (4, 5):  # x > limit, x >= limit
                return np.maximum(0, -((limit[0] - start[1] - (pred == 5)) // -step))
            return None

        found = bound(cond.operands[0])
        return np.asarray(found if found is not None else float(MAX_TRIPS + 1))


_STATE_PASSES = 4  # evaluations of the grid to follow scalars a kernel keeps in SMEM from step to step


def control_counts(kernel: Kernel, grid: tuple, tables: list | None, unseen: frozenset = frozenset(),
                   decisions: bool = False) -> ControlCounts:
    """The runs of each loop and branch of the kernel's body at every grid step (``grid``:
    the grid's values; ``tables``: the scalar-prefetch values, or None). Raises
    ``Unpriceable`` for a loop whose trip count has no upper bound. ``unseen``: items whose
    behaviour here no check saw (``unseen_items``), charged at a bound: an arm wherever its
    branch is reached, a loop at its largest trip count at every step that reaches it.
    ``decisions``: also record the sides of the body's decision ops in ``patterns``.

    A kernel that stores into its scalar-prefetch tables (a flag, the sequence it stopped
    at) reads at each step what the previous steps left there: the grid is evaluated again
    with each stored element's value at the start of each step taken from the previous
    evaluation (the value left at the step before), until they agree (a few passes); else
    its loads from those tables are unknown."""
    if kernel.body is None:
        return ControlCounts(tuple(grid), work=[kernel.flops, kernel.vector_ops, kernel.transcendentals],
                             dma=kernel.dma_bytes)
    first = _Evaluator(kernel, grid, tables, unseen=unseen, decisions=decisions)
    if not first.written or tables is None:
        return first.run()
    steps = math.prod(grid)  # 1 for no grid
    shape = tuple(grid)
    state: dict = {}
    for _ in range(_STATE_PASSES):
        ev = _Evaluator(kernel, grid, tables, state, unseen, decisions)
        try:
            counts, error = ev.run(), None
        except Unpriceable as e:  # perhaps only with this pass's guess of the state
            counts, error = None, e
        if ev.lost:
            break
        following = {}
        for key, (lo, hi) in ev.smem.items():
            start = np.asarray(tables[key[0]])[key[1]]
            pair = []
            for bound in (lo, hi):
                flat = np.broadcast_to(np.asarray(bound, np.int64), shape).reshape(steps)
                shifted = np.concatenate([[start], flat[:-1]]).astype(np.int64)
                pair.append(shifted.reshape(shape))
            following[key] = _tight(pair[0], pair[1])
        if following.keys() == state.keys() and all(
                np.array_equal(following[k][0], state[k][0]) and np.array_equal(following[k][1], state[k][1])
                for k in state):
            if error is not None:
                raise error
            return counts
        state = following
    return _Evaluator(kernel, grid, tables, None, unseen, decisions).run()  # not followed: those loads are unknown


@dataclass(frozen=True)
class Unseen:
    """What the check never saw a kernel do at full size (``as_unseen``), priced at a bound:
    loops and arms (``items``), and ``windows`` as a fresh block every step. ``short``:
    inputs read whole at the check size but not at full size (window indices), as an index
    map ``jnp.minimum(i, 3)`` reads the rows of a check whose grid has four row blocks and
    only those at full size; ``decisions``: the ``control_patterns`` and ``window_patterns``
    keys of the decisions that went a way they never did in the check, in the body (whose
    dependent loops and arms are among ``items``) or in a window's index map
    (``jnp.where(i < 4, i, 4)`` re-reads one block where the check read each), and of the
    windows whose block stays where a grid axis advances though it always moved in the
    check, or the reverse (``("moves", window, axis)``). ``grid``: axes sized at run time
    that run fewer steps at full size than at any check size: no bound prices them."""

    items: frozenset = frozenset()
    short: frozenset = frozenset()
    decisions: frozenset = frozenset()
    grid: frozenset = frozenset()

    @property
    def windows(self) -> frozenset:
        return self.short | {k[1] for k in self.decisions if k[0] != "decision"}

    def __bool__(self) -> bool:
        return bool(self.items or self.short or self.decisions or self.grid)


def unseen_items(seen: dict, found: dict) -> frozenset:
    """The keys of ``control_patterns`` and ``window_patterns`` that do at full size
    (``found``: their patterns there) what they never did in the check-size run (``seen``:
    theirs there): the check verified nothing of that. A branch that runs at every step of
    the check but not of the full grid, as in a kernel that computes only while
    ``program_id(0) < 2``, is correct at a size where the grid has two steps and would price
    the rest of the full grid at nothing; so is a loop bound ``jnp.maximum(3 - i, 1)``, whose
    maximum takes its second operand only past the check's grid. A loop that runs fewer trips
    at some full-size step than at any check-size step (``("fewest", n)``) did so too: a trip
    count ``3 - i + (i // 2) * (i - 2)`` runs 3 and 2 trips on the check's two row blocks, as
    ``jnp.where(i == 0, 3, 2)`` does, and 1 past them."""
    return frozenset(i for i, did in found.items() if _new(did, seen.get(i, set())))


def _new(did: set, before: set) -> bool:
    fewest = min((p[1] for p in before if isinstance(p, tuple)), default=math.inf)
    return any(p[1] < fewest if isinstance(p, tuple) else p not in before for p in did)


def pattern_sites(kernel: Kernel) -> dict:
    """Where each key of ``control_patterns`` and ``window_patterns`` comes from in the
    kernel's Mosaic module: {key: (function name, op index in preorder, part)}, part "loop",
    "then", "else" or "decision". The program comparison aligns ops, not keys
    (``programs.verify_artifacts``): through these, the keys of two sizes are matched where a
    Python loop unrolled more times at full size numbers the ops after it differently. A
    block's moves (``("moves", window, axis)``) are no op's: their keys match as they are."""
    sites: dict = {}
    if kernel.body is not None:
        for op in _all_ops(kernel.body.region):
            if op.item >= 0:
                sites[op.item] = (kernel.name, op.at, "loop" if op.name in _LOOPS else "then")
            if op.else_item >= 0:
                sites[op.else_item] = (kernel.name, op.at, "else")
            if op.decision >= 0:
                sites[("decision", op.decision)] = (kernel.name, op.at, "decision")
    for w in kernel.windows:
        t = kernel.transforms.get(w.transform) if w.transform else None
        for k, (name, *_) in enumerate(t.ops if t is not None else ()):
            if name in _DECISIONS:
                sites[("index", w.index, k)] = (w.transform, k, "decision")
    return sites


def control_patterns(call: CustomCall, prefetch: list | None) -> dict:
    """What each loop, arm and decision of the body of the kernel of ``call`` does over its
    grid (``ControlCounts.patterns``), and under ``("grid", axis)`` the steps of each grid
    axis sized at run time, compared as a loop's fewest trips are (``("fewest", n)``: the
    grid is a loop too); ``prefetch`` as for ``kernel_features``."""
    kernel = parse_kernel(call)
    bounds, tables = _split(kernel, prefetch)
    grid, bound = grid_values(kernel, bounds)
    found = {("grid", a): {("fewest", float(grid[a]))}
             for a, b in enumerate(kernel.iteration_bounds) if b is None and bound is None}
    if kernel.body is None:
        return found
    return {**control_counts(kernel, grid, tables, decisions=True).patterns, **found}


def window_patterns(call: CustomCall, prefetch: list | None) -> tuple[dict, dict]:
    """What the index maps of the kernel of ``call`` do over its grid, each evaluated once:
    under ``("index", window, position)`` the sides each decision op takes (``_sides``),
    under ``("moves", window, axis)`` whether the block changes or stays as that axis
    advances (``_moves``); and the fraction of each input's elements its blocks read (by
    window index; inputs whose maps cannot be evaluated left out). Empty for a grid sized at
    run time. ``prefetch`` as for ``kernel_features``."""
    kernel = parse_kernel(call)
    bounds, tables = _split(kernel, prefetch)
    grid, bound = grid_values(kernel, bounds)
    found: dict = {}
    read: dict = {}
    if bound is not None:
        return found, read
    points = grid_points(grid)
    for w in kernel.windows:
        sides: dict = {}
        idx = block_indices(kernel, w, points, tables, sides)
        found.update({("index", w.index, k): did for k, did in sides.items()})
        if idx is None:
            continue
        found.update({("moves", w.index, axis): did for axis, did in _moves(idx, grid).items()})
        covered = None if w.output else _covered(w, idx)
        if covered is not None:
            read[w.index] = covered
    return found, read


def _moves(idx: np.ndarray, grid: tuple) -> dict:
    """Per grid axis of more than one step, whether a window's block index "changes" or
    "stays" when that axis advances (``idx``: its block index at every step). Computed any
    way at all (``k * (1 - i // 2)``), an index that stops moving where the check saw it move
    re-reads a block the check never saw reused."""
    shaped = idx.reshape(tuple(grid) + idx.shape[1:])
    found = {}
    for axis, n in enumerate(grid):
        if n > 1:
            changed = np.any(np.diff(shaped, axis=axis) != 0, axis=-1)
            found[axis] = {side for side, hit in (("changes", changed.any()), ("stays", (~changed).any())) if hit}
    return found


def as_unseen(call: CustomCall, keys: frozenset, short: frozenset = frozenset()) -> Unseen:
    """What to price at a bound for the ``unseen_items`` ``keys`` of ``call``'s kernel: its
    loops and arms, and those whose bounds or predicates depend on a decision of its body;
    ``short``: inputs read whole only at the check size."""
    items = {k for k in keys if isinstance(k, int)}
    grid = {k for k in keys if not isinstance(k, int) and k[0] == "grid"}
    decisions = {k[1] for k in keys if not isinstance(k, int) and k[0] == "decision"}
    body = parse_kernel(call).body if decisions else None
    if body is not None:
        items |= _decided_by(body, decisions)
    return Unseen(frozenset(items), frozenset(short), frozenset(k for k in keys if not isinstance(k, int)) - grid,
                  frozenset(k[1] for k in grid))


# --- the compiled kernel's loops and branches, matched to the body's ------------------------

_MAX_MATCH_NODES = 300  # larger structures are not matched (their loops priced at a bound)
_SIZE_RATIO = 32.0  # a compiled loop or branch this many times larger or smaller than a body's is another
_MAX_MATCH_STATES = 200_000


def _align(m_roots: list, m_children: dict, m_delete: dict, d_roots: list, d_children: dict, d_delete: dict,
           match_cost) -> dict | None:
    """The cheapest ordered matching of two forests that keeps ancestry (a tree edit distance
    with deletions and matches only; a deleted node's children take its place). Returns
    {dump node: item}, or None when the forests are too large to align."""
    import sys

    sub_m: dict = {}
    sub_d: dict = {}

    def subtree(node, children, delete, memo):
        if node not in memo:
            memo[node] = delete[node] + sum(subtree(c, children, delete, memo) for c in children.get(node, ()))
        return memo[node]

    memo: dict = {}
    infinity = float("inf")

    def solve(fm: tuple, fd: tuple):
        key = (fm, fd)
        found = memo.get(key)
        if found is not None:
            return found
        if len(memo) > _MAX_MATCH_STATES:
            raise RecursionError
        if not fm:
            result = (sum(subtree(n, d_children, d_delete, sub_d) for n in fd), ())
        elif not fd:
            result = (sum(subtree(n, m_children, m_delete, sub_m) for n in fm), ())
        else:
            v, w = fm[-1], fd[-1]
            best = (infinity, ())
            cost = match_cost(v, w)
            if cost < infinity:
                inner, pairs_in = solve(tuple(m_children.get(v, ())), tuple(d_children.get(w, ())))
                rest, pairs_rest = solve(fm[:-1], fd[:-1])
                best = (cost + inner + rest, pairs_rest + pairs_in + ((w, v),))
            c, p = solve(fm[:-1] + tuple(m_children.get(v, ())), fd)
            if c + m_delete[v] < best[0]:
                best = (c + m_delete[v], p)
            c, p = solve(fm, fd[:-1] + tuple(d_children.get(w, ())))
            if c + d_delete[w] < best[0]:
                best = (c + d_delete[w], p)
            result = best
        memo[key] = result
        return result

    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20 * _MAX_MATCH_NODES + 1000))
        _, pairs = solve(tuple(m_roots), tuple(d_roots))
    except RecursionError:
        return None
    finally:
        sys.setrecursionlimit(limit)
    return dict(pairs)


def _match_control(items: tuple, counts: ControlCounts, nodes: list, pipeline: frozenset = frozenset()) -> dict | None:
    """Which MLIR loop or branch side (item) each of the compiled kernel's loops and branches
    (``nodes``: a forest of ``bundles.ControlNode``) is. Nodes in ``pipeline`` (the
    pipeline's own branch around the kernel body) and pairs of very different sizes are
    never matched: a small branch side the compiler predicated must not take the place of a
    large compiled branch."""
    all_nodes = [n for root in nodes for n in root.walk()]
    if len(items) + len(all_nodes) > _MAX_MATCH_NODES:
        return None
    m_children: dict = {}
    m_roots = []
    for i, it in enumerate(items):
        (m_children.setdefault(it.parent, []) if it.parent >= 0 else m_roots).append(i)
    d_children = {n.index: [c.index for c in n.children] for n in all_nodes}
    by_index = {n.index: n for n in all_nodes}

    def never(i: int) -> bool:
        m = counts.mult.get(i)
        return m is None or not np.any(np.asarray(m) > 0)

    m_delete = {}
    for i, it in enumerate(items):
        if it.kind == "loop":
            m_delete[i] = 0.05 if never(i) else (1.0 if it.static_trip is not None else 5.0)
        else:
            m_delete[i] = 0.01 if it.empty else (0.5 if it.yields else 1.0)
    d_delete = {n.index: (50.0 if n.trip is None else 1.0) if n.kind == "loop" else 1.0 for n in all_nodes}

    def size(it: ControlItem, n) -> float:  # a tie-breaker: how far apart their sizes are
        return min(0.1 * abs(math.log((n.size + 8.0) / (it.estimate + 8.0))), 0.4)

    def match_cost(i: int, d: int) -> float:
        it, n = items[i], by_index[d]
        if d in pipeline or not 1 / _SIZE_RATIO <= (n.size + 8.0) / (it.estimate + 8.0) <= _SIZE_RATIO:
            return float("inf")
        if it.kind == "loop" and n.kind == "loop":
            return (0.0 if (it.static_trip is None) == (n.trip is None) else 0.5) + size(it, n)
        if it.kind == "arm" and n.kind == "branch" and not it.empty:
            return size(it, n)
        return float("inf")

    return _align(m_roots, m_children, m_delete, [r.index for r in nodes], d_children, d_delete, match_cost)


@dataclass
class StepBundles:
    """A kernel's bundles per grid step (one value per step, in grid order) and the bundles
    around its grid loop, with what the reading had to assume."""

    per_step: np.ndarray
    outside: float
    notes: list


def step_bundles(kernel: Kernel, profile, grid: tuple, counts: ControlCounts) -> StepBundles:
    """Each grid step's bundles: those of the grid loop's body outside any loop or branch that
    depends on the step (spread over the steps as before: the loop runs steps + 2 times),
    plus each matched loop body times its iterations at that step and each matched branch
    side times its runs. Compiled loops matched to no loop of the body count their static
    trip count, or, with a bound held in a register, the largest trip count of the body's
    loops (with a note)."""
    name = kernel.name
    steps = math.prod(grid)  # 1 for no grid
    items = kernel.body.items if kernel.body is not None else ()
    notes: list = []
    roots = profile.control()
    if roots is None:
        notes.append(f"kernel {name}: the compiled kernel's branches overlap its loops: read as loops only "
                     "(every branch charged)")
        roots = profile.control(branches=False) or []
    grid_loop = None
    if steps > 1:  # the outermost loop (a grid sized at run time has a guard branch around it)
        outer, stack = [], list(roots)
        while stack:
            n = stack.pop()
            if n.kind == "loop":
                outer.append(n)
            else:
                stack.extend(n.children)
        grid_loop = max(outer, key=lambda r: r.hi - r.lo, default=None)
    inside = grid_loop.children if grid_loop is not None else roots
    # The pipeline's branch around the kernel body (skipping it on the two extra iterations).
    pipeline = frozenset(n.index for n in inside if n.kind == "branch" and grid_loop is not None
                         and n.size >= 0.5 * grid_loop.size)
    matched = _match_control(items, counts, inside, pipeline) if items and inside else {}
    if matched is None:
        matched = {}
        notes.append(f"kernel {name}: its loops and branches are too many to match to the compiled kernel's")
    matched_items = set(matched.values())
    largest = max((counts.max_trips.get(i, 0.0) for i in matched_items | set(counts.max_trips)), default=0.0)
    largest = max(largest, 1.0)
    groups: dict = {}
    unmatched_loops = []

    def own(node) -> int:
        return profile.count(node.lo, node.hi) - sum(profile.count(c.lo, c.hi) for c in node.children)

    def visit(node, key, factor: float) -> None:
        if node.index in matched:
            key, factor = ("mult", matched[node.index]), 1.0
        elif node.kind == "branch" and len(node.children) == 1 and node.children[0].index in matched \
                and items[matched[node.children[0].index]].kind == "loop" \
                and items[matched[node.children[0].index]].static_trip is None and own(node) <= _GUARD:
            key, factor = ("entry", matched[node.children[0].index]), 1.0  # a guard: runs if the loop does
        elif node.kind == "loop":
            if node.trip is not None:
                factor *= node.trip
            else:
                factor *= largest
                unmatched_loops.append(node)
        groups[key] = groups.get(key, 0.0) + own(node) * factor
        for c in node.children:
            visit(c, key, factor)

    if grid_loop is not None:
        base = own(grid_loop)
        scale = grid_loop.trip / steps if grid_loop.trip else 1.0
    else:
        base = profile.count(profile.addresses[0], profile.addresses[-1]) - sum(profile.count(r.lo, r.hi) for r in roots)
        scale = 1.0
    groups[("base",)] = float(base)
    for node in inside:
        visit(node, ("base",), 1.0)
    if unmatched_loops:
        notes.append(f"kernel {name}: {len(unmatched_loops)} loop(s) of the compiled kernel with a bound held in a "
                     "register could not be matched to the kernel body's loops: priced at the largest trip count "
                     f"of its loops ({int(largest)})")
    skipped = []  # branch sides that do not always run but were found in no compiled branch
    for i, it in enumerate(items):
        if it.kind != "arm" or it.empty or it.yields or i in matched_items or it.estimate < _GUARD:
            continue  # small sides are often predicated rather than branched over: no note
        reach = counts.mult.get(it.parent, 0.0) if it.parent >= 0 else 1.0  # never reached: no note
        if np.any(np.asarray(counts.mult.get(i, 0.0)) < np.asarray(reach)):
            skipped.append(it.label)
    if skipped:
        notes.append(f"kernel {name}: {', '.join(skipped)} found in no branch of the compiled kernel (predicated, "
                     "or not matched): charged wherever reached")
    total = groups.pop(("base",)) * scale
    for (kind, *rest), constant in groups.items():
        if not constant:
            continue
        table = counts.mult if kind == "mult" else counts.entries
        total = total + constant * np.asarray(table.get(rest[0], 0.0), np.float64)
    per_step = counts.flat(total).copy()
    if grid_loop is not None:
        mult = profile._multiplicity()
        addr = np.asarray(profile.addresses)
        outside = float(mult[(addr < grid_loop.lo) | (addr > grid_loop.hi)].sum())
    else:
        outside = 0.0
    return StepBundles(per_step, outside, notes)


def grid_values(kernel: Kernel, bounds: list | None) -> tuple[tuple, int | None]:
    """The grid of a Mosaic kernel (``pallas.resolve_grid``; ``bounds``: the concrete dynamic
    grid-bound operands, in order)."""
    return resolve_grid(kernel.iteration_bounds, bounds if kernel.num_dynamic_bounds else None,
                        [shape for shape, _ in kernel.prefetch])


MAX_GRID_STEPS = 1 << 22  # a grid with more steps is not simulated (each step costs ~0.35 us anyway)


def grid_points(grid: tuple) -> np.ndarray:
    """Every step's grid indices, in the order the kernel runs them (``pallas.grid_points``);
    raises ValueError for a grid of more than ``MAX_GRID_STEPS`` steps."""
    from .pallas import grid_points as points

    steps = math.prod(grid)  # 1 for no grid
    if steps > MAX_GRID_STEPS:
        raise ValueError(f"a kernel grid {tuple(grid)} of {steps} steps: more than the {MAX_GRID_STEPS} "
                         "the simulator evaluates")
    return points(grid)


def _split(kernel: Kernel, prefetch: list | None) -> tuple[list | None, list | None]:
    if prefetch is None:
        return None, None
    if len(prefetch) != kernel.num_leading:
        raise ValueError(f"kernel {kernel.name}: {len(prefetch)} prefetch values for {kernel.num_leading} "
                         "leading operands")
    n = kernel.num_dynamic_bounds
    return list(prefetch[:n]), list(prefetch[n:])


def block_indices(kernel: Kernel, window: Window, points: np.ndarray, tables: list | None,
                  sides: dict | None = None) -> np.ndarray | None:
    """The window's block index at every grid step (steps, ndim), or None (not evaluable);
    ``sides`` as for ``evaluate_transform``."""
    if not window.pipelined:
        return None
    if window.transform is None:  # no grid: the one block at the origin
        return np.zeros((points.shape[0], len(window.shape)), np.int64)
    t = kernel.transforms.get(window.transform)
    if t is None:
        return None
    idx = evaluate_transform(t, points, tables, sides)
    if idx is None or idx.shape[1] != len(window.block_shape):
        return None
    return idx


def kernel_features(call: CustomCall, prefetch: list | None = None, profile=None,
                    unseen: Unseen = Unseen()) -> KernelFeatures:
    """The ``pallas.KernelFeatures`` of one ``tpu_custom_call``, from its Mosaic module alone.

    ``prefetch``: the concrete values of the call's leading operands (its dynamic grid bounds,
    then its scalar-prefetch tables) at full size, or None: a run-time grid axis then takes
    an upper bound, and index maps that read tables a fresh block every step. ``profile``:
    the compiled kernel's ``bundles.BundleProfile``, if dumped: each grid step's compute is
    then its bundles at that step (``step_bundles``), else the analytic estimate of the work
    that runs on average per step.

    The loops and branches of the body are evaluated at every grid step
    (``control_counts``); raises ``Unpriceable`` for a loop whose trip count has no upper
    bound. ``unseen``: what the check never saw it do (``Unseen``), priced at a bound: its
    loops and arms as ``control_counts`` says, its inputs as a fresh block every step."""
    from .pallas import Stream, assemble

    kernel = parse_kernel(call)
    bounds, tables = _split(kernel, prefetch)
    grid, bound = grid_values(kernel, bounds)
    points = grid_points(grid)
    bounded = unseen.windows
    fresh = np.arange(len(points), dtype=np.int64)[:, None] if bounded else None  # a bound, not unknown
    streams = [Stream(w.block_bytes, fresh if w.index in bounded else block_indices(kernel, w, points, tables),
                      w.output, w.buffers)
               for w in kernel.windows if w.pipelined]
    try:
        counts = control_counts(kernel, grid, tables, unseen.items)
        notes = counts.notes(kernel.name, kernel.body.items) if kernel.body is not None else []
        notes += [f"kernel {kernel.name}: the blocks of window {i} at full size are not those the check-size run "
                  "verified (an input read whole only at the check size, or an index map deciding a way it never "
                  "did there, or keeping a block where it always moved on): priced as a fresh block every step"
                  for i in sorted(bounded)]
        dma, groups, waited, waited_groups = (counts.flat(x) if np.ndim(x) else x for x in (
            counts.dma, counts.dma_groups, counts.waited_dma, counts.waited_groups))
        work = (counts.work[0], counts.work[1], counts.work[2], dma)
        per_step, outside = None, 0.0
        if profile is not None:
            found = step_bundles(kernel, profile, grid, counts)
            per_step, outside = found.per_step, found.outside
            notes += found.notes
    except Unpriceable:
        raise
    except EVALUATION_ERRORS as e:  # not priced on a guess
        raise Unpriceable(f"kernel {kernel.name}: its loops and branches could not be evaluated "
                          f"({type(e).__name__}: {e})") from e
    k = assemble(kernel.name, grid, streams, work, kernel.vmem_bytes, tuple(shape for shape, _ in call.results),
                 bound, bundles=per_step, dma_groups=groups, waited_dma=waited, waited_groups=waited_groups)
    k.bundles_outside = outside
    k.notes = notes
    return k


# --- output coverage -----------------------------------------------------------------------

class Coverage(list):
    """The problems ``output_coverage`` found (a list of messages: empty when every element
    of every checked output is written), with ``unverified``: why some outputs could not be
    checked (left in HBM and written by the kernel's own DMAs, an index map that cannot be
    evaluated, aliased to an input, ...). Those are not problems."""

    def __init__(self, problems=(), unverified=()):
        super().__init__(problems)
        self.unverified = list(unverified)


def _percent(fraction: float) -> str:
    p = 100.0 * fraction
    return f"{p:.0f}%" if p >= 1 and abs(p - round(p)) < 0.05 else f"{p:.3g}%"


def output_coverage(call: CustomCall, prefetch: list | None = None) -> Coverage:
    """Which output elements no grid step writes, with the index maps evaluated over the grid.

    The pipeline writes an output block back whenever its index moves on: every element of
    a visited block is written (whatever the body stored in it). Returns human-readable
    problems, one per output with unwritten elements, e.g. "output 0: 50% of its elements
    are never written (grid (1, 4, 2), block (256, 256) of (512, 1024))"; empty when every
    element of every checked output is written. ``prefetch`` as for ``kernel_features``."""
    kernel = parse_kernel(call)
    bounds, tables = _split(kernel, prefetch)
    problems, unverified = [], []
    aliased = {out: operand for out, operand in kernel.aliases}
    grid, bound = grid_values(kernel, bounds)
    points = None
    for k, w in enumerate(kernel.outputs):
        label = f"output {k}"
        if k in aliased:
            unverified.append(f"{label}: aliased to operand {aliased[k]}; elements no step writes keep its values")
            continue
        if not w.pipelined:
            unverified.append(f"{label}: left in HBM (memory space {w.memory_space}), written by the kernel's "
                              "own DMAs: not verified")
            continue
        if w.element:
            unverified.append(f"{label}: an element-offset window: not verified")
            continue
        if bound is not None:
            unverified.append(f"{label}: the grid is sized at run time and its size is unknown: not verified")
            continue
        shape, block = tuple(w.shape), tuple(w.block_shape)
        if len(shape) != len(block) or any(b <= 0 for b in block):
            unverified.append(f"{label}: block {block} does not match the array's shape {shape}: not verified")
            continue
        if points is None:
            points = grid_points(grid)
        covered = _covered(w, block_indices(kernel, w, points, tables))
        if covered is None:
            why = "reads scalar-prefetch tables whose values are unknown" if tables is None and kernel.prefetch \
                else "cannot be evaluated"
            unverified.append(f"{label}: its index map {why}: not verified")
            continue
        if covered >= 1.0:
            continue
        problems.append(f"{label}: {_percent(1.0 - covered)} of its elements are never written "
                        f"(grid {grid}, block {block} of {shape})")
    return Coverage(problems, unverified)


def _covered(w: Window, idx: np.ndarray | None) -> float | None:
    """The fraction of the elements of window ``w``'s array that its blocks over the grid
    visit (``idx``: ``block_indices``), or None where its index map cannot be evaluated (or
    its block does not fit)."""
    shape, block = tuple(w.shape), tuple(w.block_shape or ())
    if idx is None or w.element or len(shape) != len(block) or any(b <= 0 for b in block):
        return None
    if not shape:  # a scalar: visited if any step runs
        return 1.0 if len(idx) else 0.0
    counts = np.asarray([-(-s // b) for s, b in zip(shape, block)])
    visited = np.unique(idx[np.all((idx >= 0) & (idx < counts), axis=1)], axis=0)
    # Elements of the blocks visited (those at the far edge hold what is left of the array).
    extents = [np.minimum(b, s - visited[:, d] * b) for d, (s, b) in enumerate(zip(shape, block))]
    return float(np.sum(functools.reduce(np.multiply, extents, np.ones(len(visited))))) / float(math.prod(shape))
