"""The judge's proof that a candidate's three exported programs are one program.

The candidate's process (``candidate_process.py``) is untrusted: it traces ``workload`` at
the full size and at a check size and exports three programs, ``full_tpu`` (what the judge
compiles and prices), ``check_tpu`` and ``check_cpu`` (the same check-size program with
every ``pallas_call`` interpreted: what the judge runs on its own inputs). A correct
``check_cpu`` says nothing about ``full_tpu`` unless they are the same program, so before
anything runs, ``verify_artifacts`` checks the StableHLO the judge deserialized itself:

1. **Allowed ops only** (``allowed_ops``): StableHLO, ``func`` and the CHLO math ops jax
   emits; ``stablehlo.custom_call`` only as ``tpu_custom_call`` inside a
   ``pallas_kernel_<n>`` function on TPU, and none on CPU. Rejected, with a message that
   names it: host callbacks (``jax.pure_callback``, ``io_callback``, a leftover
   ``jax.debug.print``/``callback``: debug prints are stripped before export), ``send``/
   ``recv``, ``infeed``/``outfeed``, tokens and side effects, collectives, backend RNG ops,
   shape polymorphism, multi-platform modules (a platform-index argument), resource blobs.
   ``stablehlo.composite`` only as jax's ``chlo.top_k``, whose decomposition must be exactly
   jax's: a compiler may replace a composite it knows by name with its own implementation,
   so one named like a known op but decomposed otherwise would compute one thing on the CPU
   and another on the TPU.
2. **CPU = TPU at the check size, outside the kernels.** Every function reachable from
   ``main`` without entering a ``pallas_kernel_<n>`` has the same ops in the same order with
   the same operands (SSA values renumbered), types and attributes (locations ignored);
   each TPU ``pallas_kernel_<n>`` is one ``tpu_custom_call`` on its arguments and a return,
   with the CPU ``pallas_kernel_<n>``'s signature. This rejects
   ``lax.platform_dependent(cpu=..., tpu=...)``, which exports a different branch per
   platform. One equivalence: a mixed-precision ``dot_general`` (bf16 x f32, as in
   JAXBench's mixtral combine) is one op on the TPU, but on the CPU jax first converts each
   operand to the result's type; those exact converts, used only by dots, are skipped.
   Otherwise, on jax 0.10.2 none of the 50 templates nor the experts lowers differently for
   CPU and TPU outside its kernels (``cumsum`` lowers to ``reduce_window`` on both;
   ``top_k``'s composite is the same). ``lax.ragged_dot`` does (``chlo.ragged_dot`` on TPU
   only); it is reported by name.
3. **Check size = full size, up to sizes.** The two TPU programs are walked together:
   functions, then ops in order (kernels: their Mosaic bodies, decoded with
   ``sim.mosaic.kernel_module``, op by op the same way), aligned by op name, result count
   and type shape-skeleton. Aligned ops must have corresponding operands and equal
   attributes, except:

   - **shapes** (tensor/memref/vector dimensions, slice limits and sizes, non-negative pad
     widths) may differ freely, but a dimension may be 0 at one size only if at both, and
     a slice or load that takes a whole axis of its operand at the check size may not take
     less of it at full size (reading part of a block only where it is priced);
   - **integers** in constants and in position-like attributes (slice starts and strides,
     reduce-window windows and padding, a kernel's ``iteration_bounds``) may differ only as
     ``SizeRule`` allows (below); block shapes (``window_bounds``) as that rule allows or as
     a dimension that the programs' types have at the two sizes (a whole-axis block);
     everything else (dimension numbers, comparison predicates, flags) must be identical;
   - **floats** must be bit-identical, also inside kernels, except element counts: a float
     that is a positive integer (a mean's divisor) or its reciprocal, whose integer pair
     passes the rule or is a product of corresponding dimensions of one type;
   - **constant arrays** of equal shape compare element by element (integers by the rule,
     floats as above); an array whose shape depends on the size (a mask of valid positions
     computed in Python) can only be compared by its set of values: none of the check
     size's values may be missing at full size;
   - the kernels' ``cost_estimate`` and ``scoped_memory_configs`` (a VMEM limit) are
     compiler hints that do not change what a kernel computes, and are not compared.

   Ops present at one size only are allowed in three documented cases, all of which jax or
   an honest template produces (and nothing else is):

   - **identities jax omits**: a reshape or broadcast to the same shape, a pad by zero, a
     slice of the whole array. Views and non-negative pads may appear at either size; a
     slice only if it starts at 0 with stride 1 and, at the size it is absent, would take
     the whole operand (its extent pairs with that size's dimension by the rule);
   - **unrolled Python loops** over a dimension (``for h in range(num_kv_heads)`` in a
     kernel): the full size's extra ops repeat the last iteration both sizes have (the same
     ops on the corresponding values of the next iteration), the iteration counts pair by
     the rule, and every integer that varies between iterations steps evenly (an affine
     function of the loop index). Extra iterations only ever appear at full size;
   - **grid specialization**: where a grid axis has one step at the check size, code may
     use 0 for its index (``start = 0 if single else s * block``); the full size's scalar
     multiplications and casts of grid indices may then stand for the check size's
     constant, where it is an address operand (a load, store or slice offset) and equals
     that constant with those indices 0.

   MLIR merges equal constants, so operands that are scalar integer constants at both
   sizes are compared by value (by the rule), not by identity.

**The integer rule** (``SizeRule``). The *size values* are, for every integer config
dimension that grows from (check C, full F): the pair itself, its products with another,
the pair shifted by a few (C - k, F - k) or (C + k, F + k) with k <= 4 (a VALID
convolution's output, a padded size, n - 1), and products of up to three shifted pairs
(element counts such as batch x rows x cols). Two differing integers (c at the check size,
f at full size, f >= c, compared by absolute value when both negative) pass when:

- f/c equals F/C for a size value (c = m * C, f = m * F: a size or a count scaled like one);
- c = a*C + b and f = a*F + b with an integer a >= 1, (C, F) a size value and b small:
  |b| <= 8, or a multiple (<= 4) of a dimension that does not change, shifted by a few (a
  convolution tap's offset into a flattened image, ``n - 1`` bounds);
- c = a1*C1 + a2*C2 + b and f = a1*F1 + a2*F2 + b, a1, a2 in 1..8, for two config pairs
  or products of two (a 3-D convolution tap's offset);
- c = C // q and f = F // q, or c = ceil(C / q) and f = ceil(F / q), for one block size q
  (also for c + 1, f + 1: the last block's index), (C, F) a size value: grid extents;
- c and f are the bit lengths of C and F, or of C - 1 and F - 1 (binary-search steps).

Why this rule: every integer an honest program derives from its shapes grows with them in
one of these forms, and a value picked by comparing a size with a threshold does not. It
rejects what a size-dependent cheat needs: anything smaller at full size than at the check
size (a 0 where the check has 1, a mask bound ``0 if big else n``, fewer loop iterations or
grid steps), a flipped flag or predicate, a constant that does not grow like any dimension.
It is deliberately narrower than "any function of the sizes": a rule any pair satisfies
would prove nothing.

What it cannot see: a value that should grow with the size but is pinned (a grid axis that
honestly has one step at the check size, kept at one at full size), and a table whose shape
depends on the size (only its set of values is compared); shapes in types are taken as they
come. Those need checks of what the full-size program computes (output coverage, input
coverage), not of its text.

``ProgramMismatch`` names the first difference found: which programs, which function (and
kernel), which op (its index in the function, nested ops counted in order), what differs,
and the candidate's source line where the program records it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping

KERNEL_PREFIX = "pallas_kernel_"
TPU_TARGET = "tpu_custom_call"


class ProgramMismatch(Exception):
    """The artifacts are not one program (or use something not allowed); the message is
    what the kernel's author sees."""


# --- what a program may contain ---------------------------------------------------------

# StableHLO ops jax 0.10.2 emits for lax/jnp code on one device (elementwise math, data
# movement, reductions, control flow). Ops outside: side effects (send, recv, infeed,
# outfeed, tokens), collectives, shape polymorphism (dynamic_*), RNG ops whose bits
# depend on the backend, and custom calls (below).
STABLEHLO_OPS = frozenset("stablehlo." + n for n in """
    abs add and atan2 bitcast_convert broadcast_in_dim case cbrt ceil clamp compare complex
    composite concatenate constant convert convolution cosine count_leading_zeros divide
    dot_general dynamic_slice dynamic_update_slice exponential exponential_minus_one fft floor
    gather get_tuple_element if imag iota is_finite log log_plus_one logistic map maximum
    minimum multiply negate not optimization_barrier or pad popcnt power real reduce
    reduce_precision reduce_window remainder reshape return reverse round_nearest_afz
    round_nearest_even rsqrt scatter select select_and_scatter shift_left
    shift_right_arithmetic shift_right_logical sign sine slice sort sqrt subtract tan tanh
    transpose triangular_solve tuple while xor cholesky
""".split())
# CHLO ops jax emits (special functions and top_k; chlo.ragged_dot is TPU-only: reported).
CHLO_OPS = frozenset("chlo." + n for n in """
    acos acosh asin asinh atan atanh bessel_i1e conj cosh digamma erf erf_inv erfc
    is_inf is_neg_inf is_pos_inf lgamma next_after polygamma sinh square tan top_k zeta
    igamma igammac ragged_dot
""".split())
FUNC_OPS = frozenset({"func.func", "func.call", "func.return"})
ALLOWED_OPS = STABLEHLO_OPS | CHLO_OPS | FUNC_OPS
# Composites jax itself emits, by name: their decompositions are checked against jax's.
COMPOSITES = frozenset({"chlo.top_k"})
# Ops whose lowering jax picks per platform: named in the CPU/TPU mismatch message.
PER_PLATFORM = {"chlo.ragged_dot": "lax.ragged_dot lowers to chlo.ragged_dot on TPU but to dense ops on CPU"}

_FORBIDDEN_HINTS = {
    "stablehlo.send": "sends data to the host (a host callback or transfer)",
    "stablehlo.recv": "receives data from the host (a host callback or transfer)",
    "stablehlo.infeed": "reads an infeed queue",
    "stablehlo.outfeed": "writes an outfeed queue",
    "stablehlo.create_token": "creates an ordering token (side effects)",
    "stablehlo.after_all": "orders side effects with tokens",
    "stablehlo.rng": "draws random numbers with the backend's generator (CPU and TPU differ)",
    "stablehlo.rng_bit_generator": "draws random bits with the backend's default algorithm (CPU and TPU differ); "
                                   "use jax.random's threefry keys",
}


def _callback_message(target: str, side_effect: bool, n_results: int) -> str:
    if not side_effect:
        what = "a host callback (jax.pure_callback)"
    elif n_results == 0:
        what = ("a leftover jax.debug.print / jax.debug.callback: debug prints are stripped before export "
                "and are not supported in a judged program")
    else:
        what = "a host callback with side effects (jax.experimental.io_callback)"
    return (f"{what}, custom call `{target}`: a program must compute on the device; work done on the host "
            f"is neither compiled nor priced")


# --- reading programs ----------------------------------------------------------------------

def _ir():
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    return mlir, ir


def _parse_module(exported, ctx):
    _, ir = _ir()
    with ctx:
        return ir.Module.parse(exported.mlir_module())


def _sym(op) -> str:
    s = str(op.attributes["sym_name"]) if "sym_name" in op.attributes else ""
    return s[1:-1] if s.startswith('"') else s


def _base(name: str) -> str:
    """An op name without Mosaic's serialization prefix (``stable_mosaic.arith.addf``)."""
    return name[len("stable_mosaic."):] if name.startswith("stable_mosaic.") else name


def _functions(module) -> dict:
    return {_sym(op.operation): op.operation for op in module.body.operations if op.operation.name == "func.func"}


def _walk(op) -> list:
    """The ops nested in ``op``, in preorder."""
    _, ir = _ir()
    ops: list = []
    op.walk(lambda o: (ops.append(o), ir.WalkResult.ADVANCE)[1], ir.WalkOrder.PRE_ORDER)
    return ops[1:]


_CANDIDATE_LINE = re.compile(r'"<candidate>":(\d+)')


def _line(op) -> str:
    """`` (candidate line N)`` from the op's location, when the candidate's source is in it."""
    try:
        lines = _CANDIDATE_LINE.findall(str(op.location))
    except Exception:  # noqa: BLE001 - a location is only a hint
        return ""
    return f" (candidate line {lines[0]})" if lines else ""


def _string_value(attr) -> str:
    s = str(attr)
    return s[1:-1] if s.startswith('"') and s.endswith('"') else s


def _custom_target(op) -> str:
    return _string_value(op.attributes["call_target_name"]) if "call_target_name" in op.attributes else ""


def _has_side_effect(op) -> bool:
    return "has_side_effect" in op.attributes and str(op.attributes["has_side_effect"]) == "true"


def allowed_ops(exported, platform: str) -> None:
    """Raise ``ProgramMismatch`` unless ``exported`` is a single-``platform`` program of
    allowed ops only (module docstring, point 1)."""
    mlir, _ = _ir()
    _check_exported(exported, platform, platform.upper())
    ctx = mlir.make_ir_context()
    module = _parse_module(exported, ctx)
    with ctx:
        _check_module_ops(module, platform)


def _check_exported(exported, platform: str, label: str) -> None:
    platforms = tuple(exported.platforms)
    if len(platforms) > 1:
        raise ProgramMismatch(f"the {label} program was exported for several platforms {platforms}: a multi-platform "
                              f"module takes a platform-index argument and runs different code per platform")
    if platforms != (platform,):
        raise ProgramMismatch(f"the {label} program was exported for {platforms}, not for ({platform!r},)")
    if exported.ordered_effects or exported.unordered_effects:
        raise ProgramMismatch(f"the {label} program has side effects "
                              f"{list(exported.ordered_effects) + list(exported.unordered_effects)}: host callbacks "
                              f"and debug prints are not supported (debug prints are stripped before export)")
    if exported.nr_devices != 1:
        raise ProgramMismatch(f"the {label} program is for {exported.nr_devices} devices, not one")
    if exported.uses_global_constants:
        raise ProgramMismatch(f"the {label} program takes global constants (a platform index or shape variables)")
    if exported.disabled_safety_checks:
        raise ProgramMismatch(f"the {label} program disables jax.export's safety checks "
                              f"{list(exported.disabled_safety_checks)}")
    if any(not hasattr(a, "shape") or any(not isinstance(d, int) for d in a.shape) for a in exported.in_avals):
        raise ProgramMismatch(f"the {label} program has symbolic (shape-polymorphic) inputs")


def _check_module_ops(module, platform: str) -> None:
    funcs = _functions(module)
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func":
            raise ProgramMismatch(f"the {platform.upper()} program has a top-level `{op.name}`; only functions are "
                                  f"allowed")
    main = funcs.get("main")
    if main is None:
        raise ProgramMismatch(f"the {platform.upper()} program has no `main` function")
    if "arg_attrs" in main.attributes:
        arg_attrs = str(main.attributes["arg_attrs"])
        if "jax.global_constant" in arg_attrs or "_platform_index" in arg_attrs:
            raise ProgramMismatch(f"the {platform.upper()} program's main takes a platform-index (or other global "
                                  f"constant) argument: multi-platform programs run different code per platform")
    attrs = module.operation.attributes
    if "jax.uses_shape_polymorphism" in attrs and str(attrs["jax.uses_shape_polymorphism"]) != "false":
        raise ProgramMismatch(f"the {platform.upper()} program is shape-polymorphic")
    for fname, fop in funcs.items():
        if "!stablehlo.token" in str(fop.attributes["function_type"]):
            raise ProgramMismatch(f"function `{fname}` of the {platform.upper()} program passes tokens: side effects "
                                  f"(host callbacks, debug prints, which are stripped before export) are not supported")
        for i, op in enumerate(_walk(fop)):
            _check_op(op, fname, i, platform)


def _check_op(op, fname: str, index: int, platform: str) -> None:
    name = op.name
    if name in ALLOWED_OPS and name not in ("stablehlo.custom_call", "stablehlo.composite", "stablehlo.constant"):
        return

    def reject(what: str) -> None:
        raise ProgramMismatch(f"in function `{fname}` of the {platform.upper()} program, op #{index} `{name}`"
                              f"{_line(op)}: {what}")

    if name == "stablehlo.custom_call":
        target = _custom_target(op)
        if "callback" in target:
            reject(_callback_message(target, _has_side_effect(op), len(op.results)))
        if platform == "tpu" and target == TPU_TARGET:
            if not fname.startswith(KERNEL_PREFIX):
                reject("a tpu_custom_call outside a pallas_kernel_<n> function (Pallas kernels are wrapped one per "
                       "function)")
            return
        if platform == "cpu":
            reject(f"custom call `{target}`; the CPU program may have none (its Pallas kernels run in jax's "
                   f"interpreter, as plain ops)")
        reject(f"custom call `{target}`; only Pallas kernels (`{TPU_TARGET}`) are allowed")
    if name not in ALLOWED_OPS:
        hint = _FORBIDDEN_HINTS.get(name)
        if hint is None and (name.startswith("stablehlo.dynamic_") or name == "stablehlo.get_dimension_size"
                             or name == "stablehlo.real_dynamic_slice"):
            hint = "is for shape-polymorphic programs"
        if hint is None and any(w in name for w in ("all_", "collective", "reduce_scatter", "replica_id",
                                                     "partition_id")):
            hint = "is a multi-device collective"
        reject(f"`{name}` is not an allowed op" + (f" (it {hint})" if hint else ""))
    if name == "stablehlo.composite":
        cname = _string_value(op.attributes["name"]) if "name" in op.attributes else ""
        if cname not in COMPOSITES:
            reject(f"composite `{cname}` is not allowed (only jax's own {sorted(COMPOSITES)}): a compiler may "
                   f"replace a composite it recognizes by its name with its own implementation, not the "
                   f"decomposition the CPU runs")
    for key in op.attributes:
        if str(op.attributes[key]).startswith("dense_resource<"):
            reject(f"attribute `{key}` is an external resource blob; constants must be inline")


# --- functions as comparable node lists --------------------------------------------------------

_DIM = re.compile(r"(?<=[<x])\d+(?=x)")


def _skeleton(type_str: str) -> str:
    return _DIM.sub("?", type_str)


@dataclass
class _Node:
    """One op of a function in preorder (``index`` counts ops), or the start of a block."""

    kind: str  # "op" or "block"
    pos: int  # position in the function's node list
    index: int  # op index in the function (ops only; -1 for a block)
    op: Any  # the ir.Operation (None for a block)
    name: str  # op name without Mosaic's "stable_mosaic." prefix
    operands: tuple  # value ids
    results: tuple  # value ids: the op's results, or the block's arguments
    types: tuple  # result (or argument) types, as strings
    shape: tuple  # blocks per region
    parent: int  # pos of the enclosing op's node (-1 at the function's top level)
    depth: int

    @property
    def key(self) -> tuple:
        """What two nodes must share to be aligned (values, attributes and shapes are
        compared after alignment)."""
        return (self.kind, self.name, len(self.results), tuple(_skeleton(t) for t in self.types), self.shape,
                self.depth)


class _Func:
    """A function's ops in preorder, operands renumbered (block arguments and op results in
    order of definition), so that two programs compare whatever their SSA names."""

    def __init__(self, name: str, op):
        self.name, self.op = name, op
        self.nodes: list[_Node] = []
        self.defpos: dict[int, tuple[int, int]] = {}  # value id -> (node pos, result index)
        self.value_at: dict[tuple[int, int], int] = {}
        self.value_type: dict[int, str] = {}
        self.const: dict[int, int] = {}  # value id -> the integer a scalar integer constant holds
        _, ir = _ir()
        ops: list = []  # preorder; a walk yields plain Operations (no per-op Python class lookups)
        op.walk(lambda o: (ops.append(o), ir.WalkResult.ADVANCE)[1], ir.WalkOrder.PRE_ORDER)
        ids: dict = {}
        pos_of: dict = {}
        seen_blocks: set = set()

        def define(v, pos: int, k: int) -> int:
            vid = len(ids)
            ids[v] = vid
            self.defpos[vid] = (pos, k)
            self.value_at[(pos, k)] = vid
            self.value_type[vid] = str(v.type)
            return vid

        for index, o in enumerate(ops[1:]):
            parent = pos_of.get(o.parent, -1)
            depth = self.nodes[parent].depth + 1 if parent >= 0 else 0
            block = o.block
            if block not in seen_blocks:
                seen_blocks.add(block)
                pos = len(self.nodes)
                args = tuple(define(a, pos, k) for k, a in enumerate(block.arguments))
                self.nodes.append(_Node("block", pos, -1, None, "^block", (), args,
                                        tuple(str(a.type) for a in block.arguments), (), parent, depth))
            pos = len(self.nodes)
            pos_of[o] = pos
            name = _base(o.name)
            operands = tuple(ids.get(v, -1) for v in o.operands)
            results = tuple(define(r, pos, k) for k, r in enumerate(o.results))
            if len(results) == 1 and name in CONSTANT_OPS and "value" in o.attributes:
                m = _SCALAR_INT.fullmatch(str(o.attributes["value"]))
                if m:
                    self.const[results[0]] = int(m.group(1))
            self.nodes.append(_Node("op", pos, index, o, name, operands, results, tuple(str(r.type) for r in o.results),
                                    tuple(len(r.blocks) for r in o.regions), parent, depth))


# A scalar integer constant (not i1: flags are compared exactly): "7 : i32", "dense<7> : tensor<i32>".
_SCALAR_INT = re.compile(r"(?:dense<)?(-?\d+)>? : (?:tensor<)?(?:i(?:8|16|32|64)|ui\d+|index)>?")


def _describe(node: _Node) -> str:
    if node.kind == "block":
        return "the start of a block"
    extra = ""
    if node.name == "stablehlo.custom_call":
        extra = f" @{_custom_target(node.op)}"
    elif node.name == "func.call" and "callee" in node.op.attributes:
        extra = f" {node.op.attributes['callee']}"
    return f"`{node.name}{extra}`"


# --- the integer rule ----------------------------------------------------------------------

def size_pairs(check_config: Mapping[str, Any], full_config: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(check, full) of each integer config dimension that differs, and products of two."""
    base = sorted({(int(check_config[k]), int(full_config[k])) for k in full_config
                   if k in check_config and _is_int(full_config[k]) and _is_int(check_config[k])
                   and check_config[k] != full_config[k] and check_config[k] > 0 and full_config[k] > 0})
    pairs = set(base)
    for (c1, f1), (c2, f2) in itertools.combinations_with_replacement(base, 2):
        pairs.add((c1 * c2, f1 * f2))
    return sorted(pairs)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_OFFSET = 8  # |b| in c = a*C + b: small constant offsets (n - 1, a conv tap's 2*W + 2)
MAX_TAP = 8  # a1, a2 in two-term offsets a1*C1 + a2*C2 + b (a 3-D conv tap's 2*H*W + 2*W + 2)
MAX_PERIOD = 4096  # ops in one iteration of an unrolled loop
MAX_FACTORS = 3  # dimensions in a size value d1 * d2 * d3 (an element count)
MAX_SHIFT = 4  # k in a factor d +- k (a VALID convolution's output size, a padded size, n - 1)
MAX_TAP_FIXED = 4  # a in an offset a * (u +- k): a conv tap's row offset over a width u that does not change


def _floor_range(n: int, q: int) -> tuple[int, int]:
    """The block sizes b >= 1 with n // b == q, as [lo, hi] (empty when lo > hi)."""
    if q <= 0:
        return (n + 1, 2**62) if q == 0 else (1, 0)
    return n // (q + 1) + 1, n // q


def _ceil_range(n: int, q: int) -> tuple[int, int]:
    """The block sizes b >= 1 with ceil(n / b) == q, as [lo, hi]."""
    if q <= 0:
        return 1, 0
    return -(-n // q), (2**62 if q == 1 else -(-n // (q - 1)) - 1)


class SizeRule:
    """The integer rule at one pair of configs (module docstring)."""

    def __init__(self, check_config: Mapping[str, Any], full_config: Mapping[str, Any]):
        self.pairs = size_pairs(check_config, full_config)
        base = [(int(check_config[k]), int(full_config[k])) for k in full_config
                if k in check_config and _is_int(full_config[k]) and _is_int(check_config[k])
                and 0 < check_config[k] < full_config[k]]
        # Dimensions less a few (a VALID convolution's output, n - 1), and products of up to
        # MAX_FACTORS of them (element counts: batch x rows x cols): the size values.
        factors = sorted({(c + k, f + k) for c, f in base for k in range(-MAX_SHIFT, MAX_SHIFT + 1) if c + k >= 1})
        values = set(self.pairs)
        for n in range(1, MAX_FACTORS + 1):
            for combo in itertools.combinations_with_replacement(factors, n):
                values.add((math.prod(c for c, _ in combo), math.prod(f for _, f in combo)))
        self.values = sorted(v for v in values if v[0] < v[1])
        self.ratios = {Fraction(f, c) for c, f in self.values}
        # Offsets b in a * value + b: small, or a few times a dimension that does not change
        # (a 3-D convolution's tap (1, 1, 1) sits (H+2)*(W+2) + (W+2) + 1 into the flat input).
        fixed = {int(v) for k, v in full_config.items() if _is_int(v) and check_config.get(k) == v and v > 0}
        self.offsets = set(range(MAX_OFFSET + 1))
        for u in fixed:
            for a in range(1, MAX_TAP_FIXED + 1):
                for shift in range(-MAX_SHIFT, MAX_SHIFT + 1):
                    for k in range(-MAX_OFFSET, MAX_OFFSET + 1):
                        self.offsets.add(abs(a * (u + shift) + k))
        self.by_delta: dict[int, list] = {}
        for c, f in self.values:
            self.by_delta.setdefault(f - c, []).append((c, f))
        self._cache: dict = {}

    def __call__(self, c: int, f: int) -> bool:
        if c == f:
            return True
        if (c < 0) != (f < 0) or f == 0:
            return False
        if c < 0:
            c, f = -c, -f
        key = (c, f)
        if key not in self._cache:
            self._cache[key] = self._derived(c, f)
        return self._cache[key]

    def _derived(self, c: int, f: int) -> bool:
        if f < c:
            return False  # sizes only grow: so do the integers derived from them
        if c and Fraction(f, c) in self.ratios:  # m * a size value
            return True
        diff = f - c
        for delta, pairs in self.by_delta.items():  # a * (size value) + b, b small
            if diff % delta == 0:
                a = diff // delta
                if any(abs(c - a * C) in self.offsets for C, _ in pairs):
                    return True
        for cc, ff in ((c, f), (c + 1, f + 1)):  # a count of blocks (or its last index)
            for C, F in self.values:
                if C < cc or F < ff:
                    continue
                for rng in (_floor_range, _ceil_range):
                    lo1, hi1 = rng(C, cc)
                    lo2, hi2 = rng(F, ff)
                    if max(lo1, lo2, 1) <= min(hi1, hi2):
                        return True
        for C, F in self.pairs:
            for e in (0, 1):  # a log-depth count (binary search steps, tree levels)
                if C > e and (c, f) == ((C - e).bit_length(), (F - e).bit_length()):
                    return True
        for (C1, F1), (C2, F2) in itertools.product(self.pairs, repeat=2):  # a1*C1 + a2*C2 + b
            for a1 in range(1, MAX_TAP + 1):
                rest = diff - a1 * (F1 - C1)
                d2 = F2 - C2
                if rest <= 0 or rest % d2:
                    continue
                a2 = rest // d2
                if a2 <= MAX_TAP and abs(c - a1 * C1 - a2 * C2) in self.offsets:
                    return True
        return False


def size_derived(c: int, f: int, check_config: Mapping[str, Any], full_config: Mapping[str, Any]) -> bool:
    """True when the integer ``c`` at ``check_config`` may be ``f`` at ``full_config``."""
    return SizeRule(check_config, full_config)(c, f)


# --- comparing attributes and types ---------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<hex>(?<![\w.])0x[0-9A-F]{4,}(?![\w]))
  | (?P<dim>(?<=[<x])\d+(?=x))
  | (?P<float>(?<![\w.])-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.]))
  | (?P<int>(?<![\w.#@%])-?\d+(?![\w.]))
  | (?P<key>[A-Za-z_][\w.]*)(?=\s*=[^=])
""", re.X)

# Attributes (or keys inside one) whose integers may follow the size rule; every other
# integer (dimension numbers, predicates, flags, operand counts) must be identical.
RULED_ATTRS = frozenset({
    "value",  # stablehlo.constant, arith.constant
    "start_indices", "strides", "offsets", "static_offsets", "static_strides",  # where a slice starts
    "window_dimensions", "window_strides", "padding",  # reduce_window (cumsum's window is the whole axis)
    "iteration_bounds",  # a kernel's grid
})
# Integers that are shapes (the result shape follows from them): free like the dimensions
# in types, but never negative (a negative pad crops).
SHAPE_ATTRS = frozenset({"limit_indices", "slice_sizes", "sizes", "static_sizes",
                         "edge_padding_low", "edge_padding_high", "interior_padding"})
# A kernel's block shapes: the size rule, or a dimension the program's types have at both
# sizes (a block spanning a whole array axis).
BLOCK_ATTRS = frozenset({"window_bounds"})


@dataclass
class _Tokens:
    skeleton: str
    numbers: list  # (kind, text, key)


def _tokens(text: str, key: str) -> _Tokens:
    parts, numbers = [], []
    pos, current = 0, key
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "key":
            current = m.group()
            continue
        if kind == "str":
            continue
        parts.append(text[pos:m.start()])
        parts.append("\x00")
        numbers.append((kind, m.group(), current))
        pos = m.end()
    parts.append(text[pos:])
    return _Tokens("".join(parts), numbers)


class _Diff(Exception):
    """A difference found while comparing two values; the caller adds where."""


def _float_value(text: str) -> float | None:
    import struct

    if text.startswith("0x"):
        digits = text[2:]
        if len(digits) == 8:
            return struct.unpack(">f", bytes.fromhex(digits))[0]
        if len(digits) == 16:
            return struct.unpack(">d", bytes.fromhex(digits))[0]
        return None  # 16-bit floats: compared exactly
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class _Deferred:
    """A value whose check needs every type of the two programs first."""

    kind: str  # "float" or "block"
    a: str
    b: str
    where: tuple  # arguments of _Pair.fail


class _Sized:
    """Comparison of a check-size program (first) with a full-size one (second)."""

    def __init__(self, rule: SizeRule, observe=None):
        self.rule = rule
        self.observe = observe
        self.dim_pairs: set = set()  # (check, full) of every dimension seen in corresponding types
        self.dim_products: set = set()  # products of subsets of one type's dimensions
        self.deferred: list[_Deferred] = []

    def types(self, a: str, b: str) -> None:
        """Record the dimensions of two corresponding types (for deferred checks)."""
        da, db = _dims_of(a), _dims_of(b)
        if len(da) != len(db):
            return
        for sa, sb in zip(da, db):
            if len(sa) != len(sb):
                continue
            self.dim_pairs.update(zip(sa, sb))
            if len(sa) <= 6:
                for r in range(1, len(sa) + 1):
                    for idx in itertools.combinations(range(len(sa)), r):
                        self.dim_products.add((math.prod(sa[i] for i in idx), math.prod(sb[i] for i in idx)))

    def numbers(self, a: str, b: str, key: str, what: str) -> list:
        """Compare two attribute (or type) texts; returns the float and block pairs whose
        check is deferred, raises _Diff on anything else that differs."""
        if a == b:
            return []
        ta, tb = _tokens(a, key), _tokens(b, key)
        if ta.skeleton != tb.skeleton or len(ta.numbers) != len(tb.numbers):
            raise _Diff(f"{what} differs: `{_short(a)}` at the check size, `{_short(b)}` at full size")
        later = []
        for (ka, xa, key_a), (kb, xb, _) in zip(ta.numbers, tb.numbers):
            if xa == xb:
                continue
            if ka != kb and not ({ka, kb} <= {"float", "hex"}):
                raise _Diff(f"{what} differs: `{_short(a)}` at the check size, `{_short(b)}` at full size")
            if ka == "dim":
                ok = (int(xa) == 0) == (int(xb) == 0)
                self._observe("dim", key_a, int(xa), int(xb), ok)
                if not ok:
                    raise _Diff(f"{what}: a dimension is {xa} at the check size but {xb} at full size (a dimension "
                                f"may be empty at one size only if it is empty at both)")
                continue
            if ka in ("float", "hex"):
                later.append(("float", xa, xb))
                continue
            c, f = int(xa), int(xb)
            if key_a in SHAPE_ATTRS:
                ok = (c >= 0) == (f >= 0)
                self._observe("int", key_a, c, f, ok)
                if not ok:
                    raise _Diff(f"{what}: `{key_a}` is {c} at the check size but {f} at full size")
                continue
            if key_a in BLOCK_ATTRS:
                later.append(("block", xa, xb))
                continue
            ok = key_a in RULED_ATTRS and self.rule(c, f)
            self._observe("int", key_a, c, f, ok)
            if not ok:
                if key_a not in RULED_ATTRS:
                    raise _Diff(f"{what}: `{key_a}` is {c} at the check size but {f} at full size; only integer "
                                f"constants and size-like attributes may differ between sizes")
                raise _Diff(_int_message(what, c, f))
        return later

    def check_deferred(self, d: _Deferred) -> str | None:
        """None when the deferred pair is allowed, else why not."""
        if d.kind == "block":
            c, f = int(d.a), int(d.b)
            ok = self.rule(c, f) or (c, f) in self.dim_pairs
            self._observe("block", "window_bounds", c, f, ok)
            return None if ok else (f"a block dimension is {c} at the check size but {f} at full size, which neither "
                                    f"scales with the workload's dimensions nor spans an array axis")
        va, vb = _float_value(d.a), _float_value(d.b)
        ok = va is not None and vb is not None and self._float_pair(va, vb)
        self._observe("float", "value", d.a, d.b, ok)
        if ok:
            return None
        return (f"the float {d.a} at the check size is {d.b} at full size; float constants must be identical at "
                f"both sizes, except element counts (a mean's divisor n, or 1/n) derived from the sizes")

    def _float_pair(self, va: float, vb: float) -> bool:
        """Floats may differ only as counts of elements: integers derived from the sizes (or
        products of a tensor's dimensions), or their reciprocals."""
        if not (math.isfinite(va) and math.isfinite(vb)) or va == 0 or vb == 0 or (va < 0) != (vb < 0):
            return False
        va, vb = abs(va), abs(vb)
        for x, y in ((va, vb), (1 / va, 1 / vb)):
            c, f = round(x), round(y)
            if c >= 1 and f >= 1 and math.isclose(c, x, rel_tol=1e-6) and math.isclose(f, y, rel_tol=1e-6):
                if self.rule(c, f) or (c, f) in self.dim_products:
                    return True
        return False

    def _observe(self, *args) -> None:
        if self.observe:
            self.observe(*args)


def _int_message(what: str, c: int, f: int) -> str:
    return (f"{what}: the integer {c} at the check size is {f} at full size, which is not derived from the "
            f"workload's dimensions (integers may differ between sizes only as sizes do: scaled like one, offset "
            f"by a few, a count of blocks; see jaxbench_env/programs.py): is it chosen by comparing a size?")


_SHAPED = re.compile(r"(?:tensor|memref|vector)<((?:\d+x)*)")


_FLOAT_BITS = {"bf16": 16, "f16": 16, "f32": 32, "f64": 64}


def _exact_float_convert(src: str, dst: str) -> bool:
    """A convert from tensor type ``src`` to ``dst`` (one shape) that loses nothing: a float
    element to the same type or a wider one."""
    if not (src.startswith("tensor<") and dst.startswith("tensor<")):
        return False
    (dims_a, _, a), (dims_b, _, b) = src[7:-1].rpartition("x"), dst[7:-1].rpartition("x")
    return dims_a == dims_b and a in _FLOAT_BITS and b in _FLOAT_BITS and (a == b or _FLOAT_BITS[a] < _FLOAT_BITS[b])


def _dims_of(type_str: str) -> list[tuple]:
    return [tuple(int(d) for d in m.group(1).split("x") if d) for m in _SHAPED.finditer(type_str)]


class _Same:
    """Exact comparison (the CPU and TPU programs at the check size)."""

    def types(self, a: str, b: str) -> None:
        pass

    def numbers(self, a: str, b: str, key: str, what: str) -> list:
        if a != b:
            raise _Diff(f"{what} differs: `{_short(a)}` on the CPU, `{_short(b)}` on the TPU")
        return []


def _short(s: str, n: int = 160) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


# --- equivalences between sizes ---------------------------------------------------------------

# Ops that only view or extend their first operand: jax omits them where they would be the
# identity (a reshape or broadcast to the same shape, a pad by zero), so they may be present
# at one size only.
VIEW_OPS = frozenset({"stablehlo.reshape", "stablehlo.broadcast_in_dim", "vector.shape_cast", "vector.broadcast",
                      "tpu.memref_reshape", "tpu.memref_squeeze"})
PAD_OPS = frozenset({"stablehlo.pad"})
# Slices, which jax omits where they would take the whole array: present at one size only
# if they start at 0 with stride 1 and, at the size they are absent, would take everything.
SLICE_OPS = frozenset({"stablehlo.slice", "stablehlo.dynamic_slice", "vector.extract_strided_slice"})
CONSTANT_OPS = frozenset({"stablehlo.constant", "arith.constant"})
# Ops that take a part of their first operand, axis by axis.
PART_OPS = frozenset({"stablehlo.slice", "stablehlo.dynamic_slice", "vector.extract_strided_slice", "vector.load",
                      "tpu.strided_load", "tpu.load", "tpu.memref_slice"})
# Scalar integer arithmetic the full-size program may have where the check size has its
# result as a constant: at a size where a grid axis has one step, its index is 0, and code
# specialized for that size folds ``s * block`` to 0.
# Ops whose integer operands after the first are addresses (where in a ref to read or write).
ADDRESS_OPS = frozenset({"vector.load", "vector.store", "tpu.vector_store", "tpu.load", "tpu.store", "tpu.memref_slice",
                         "tpu.strided_load", "tpu.strided_store", "memref.load", "memref.store"})
FOLD_OPS = {
    "arith.muli": lambda a, b: a * b,
    "arith.index_cast": lambda a: a, "arith.index_castui": lambda a: a, "arith.extsi": lambda a: a,
    "arith.extui": lambda a: a, "tpu.assume_multiple": lambda a: a,
}


# --- comparing two programs ---------------------------------------------------------------------

@dataclass
class _Pair:
    """Two programs being compared: labels for messages, their functions, the mode."""

    kind: str  # "platform" (CPU vs TPU at the check size) or "size" (check vs full TPU)
    labels: tuple  # ("check-size CPU", "check-size TPU")
    funcs: tuple  # ({name: op}, {name: op})
    mode: Any  # _Same or _Sized
    names: dict = field(default_factory=dict)  # function name in the first -> in the second
    queue: list = field(default_factory=list)
    kernel_pairs: list = field(default_factory=list)
    keep: list = field(default_factory=list)  # MLIR contexts of parsed kernels, alive while comparing
    # Per pair of Mosaic kernel bodies compared (``kernel_key`` of the first, of the second):
    # {(function name, op index in the second): the op of the first it was aligned with}.
    aligned: dict = field(default_factory=dict)
    cpu_first: bool = False  # a CPU program against a TPU one: jax's CPU-only lowerings are allowed

    def fail(self, fname: str, node: _Node | None, what: str, kernel: str = "") -> None:
        a, b = self.labels
        if self.kind == "platform":
            head = (f"the {a} and {b} programs differ outside the Pallas kernels, so the CPU program the judge "
                    f"checks is not the TPU program it prices")
            tail = ("Code outside pallas_call must lower the same for both platforms (no lax.platform_dependent "
                    "or other per-platform choices).")
        else:
            head = f"the {b} program is not the {a} program at another size"
            tail = ("Both sizes must trace to the same program: only shapes and size-derived integers may differ "
                    "(no Python branches on shapes, no values chosen by size).")
        where = f"in function `{fname}`"
        if kernel:
            where += f", Pallas kernel `{kernel}` (its Mosaic body)"
        if node is not None:
            where += f", op #{node.index} {_describe(node)}" if node.kind == "op" else ", the start of a block"
            if node.parent >= 0:
                where += " (nested in a region)"
            if node.op is not None:
                where += _line(node.op)
        raise ProgramMismatch(f"{head}: {where}: {what}. {tail}")

    def map_symbol(self, a: str, b: str, fname: str, node: _Node) -> None:
        if a.startswith(KERNEL_PREFIX) or b.startswith(KERNEL_PREFIX):
            if a != b:
                self.fail(fname, node, f"it calls `{a}` in one program and `{b}` in the other")
            if self.kind == "platform":
                if (a, b) not in self.kernel_pairs:
                    self.kernel_pairs.append((a, b))
                return
        if a in self.names:
            if self.names[a] != b:
                self.fail(fname, node, f"it calls `{b}` where the other program calls `{self.names[a]}`")
            return
        if b in self.names.values():
            self.fail(fname, node, f"function `{b}` corresponds to two different functions")
        if a not in self.funcs[0] or b not in self.funcs[1]:
            self.fail(fname, node, f"it refers to a function (`{a}` / `{b}`) the program does not define")
        self.names[a] = b
        self.queue.append((a, b))

    def run(self) -> None:
        self.names["main"] = "main"
        self.queue.append(("main", "main"))
        while self.queue:
            a, b = self.queue.pop(0)
            self.function(a, b)
        if isinstance(self.mode, _Sized):
            for d in self.mode.deferred:
                why = self.mode.check_deferred(d)
                if why:
                    self.fail(*d.where[:2], why, *d.where[2:])

    def function(self, a: str, b: str) -> None:
        fa, fb = self.funcs[0][a], self.funcs[1][b]
        label = a if a == b else f"{a}` / `{b}"
        self.attrs(fa, fb, label, None, skip={"sym_name", "sym_visibility"})
        na, nb = _Func(a, fa), _Func(b, fb)
        if self.kind == "size" and a.startswith(KERNEL_PREFIX):
            _kernel_shape(na.nodes, a, self.labels[0])
            _kernel_shape(nb.nodes, b, self.labels[1])
        _Body(self, na, nb, label).run()

    def attrs(self, oa, ob, fname: str, node: _Node | None, skip=frozenset(), kernel: str = "") -> None:
        _, ir = _ir()
        ka = [k for k in oa.attributes if k not in skip]
        kb = [k for k in ob.attributes if k not in skip]
        if sorted(ka) != sorted(kb):
            self.fail(fname, node, f"its attributes differ: {sorted(set(ka) ^ set(kb))} in one program only", kernel)
        for k in ka:
            va, vb = oa.attributes[k], ob.attributes[k]
            try:
                if isinstance(va, ir.FlatSymbolRefAttr) and isinstance(vb, ir.FlatSymbolRefAttr) and not kernel:
                    self.map_symbol(va.value, vb.value, fname, node)
                    continue
                if k == "backend_config" and node is not None and node.name == "stablehlo.custom_call" \
                        and self.kind == "size":
                    _Kernels(self).compare(va, vb, fname)
                    continue
                if k == "function_type":
                    self.mode.types(str(va), str(vb))
                    later = self.mode.numbers(str(va), str(vb), "type", "the signature")
                else:
                    later = self.numbers_attr(va, vb, k)
            except _Diff as d:
                self.fail(fname, node, str(d), kernel)
            for kind, xa, xb in later:
                self.mode.deferred.append(_Deferred(kind, xa, xb, (fname, node, kernel)))

    def numbers_attr(self, va, vb, key: str) -> list:
        _, ir = _ir()
        sa, sb = str(va), str(vb)
        if sa == sb:
            return []
        if isinstance(self.mode, _Sized) and isinstance(va, ir.DenseElementsAttr) and \
                isinstance(vb, ir.DenseElementsAttr) and not (va.is_splat and vb.is_splat):
            return self.dense(va, vb, key) or []
        return self.mode.numbers(sa, sb, key, f"attribute `{key}`")

    def dense(self, va, vb, key: str) -> list:
        """Two constant arrays (not both splats) at the two sizes; returns the float pairs
        whose check is deferred."""
        import numpy as np

        if _skeleton(str(va.type)) != _skeleton(str(vb.type)):
            raise _Diff(f"the constant `{key}` has a different type: {va.type} vs {vb.type}")
        shape_a, shape_b = tuple(va.type.shape), tuple(vb.type.shape)
        xa, xb = _dense_values(va), _dense_values(vb)
        if xa is None or xb is None:
            raise _Diff(f"the constant `{key}` differs between the sizes")
        if shape_a == shape_b and va.is_splat != vb.is_splat:  # the same table, one of them uniform
            size = max(xa.size, xb.size)
            xa, xb = np.resize(xa, size), np.resize(xb, size)
        if shape_a != shape_b:
            # A table computed from the sizes (a mask of valid positions): which values it
            # holds can be compared, not where.
            missing = np.setdiff1d(np.unique(xa), np.unique(xb))
            if missing.size:
                raise _Diff(f"the constant array `{key}` ({shape_a} at the check size, {shape_b} at full size) "
                            f"holds values at the check size ({_short(str(missing.tolist()), 60)}) that it lacks at "
                            f"full size: a table computed from the sizes may gain values as they grow, not lose any")
            return []
        if xa.dtype.kind not in "iub":
            return [("float", repr(float(c)), repr(float(f))) for c, f in zip(xa.tolist(), xb.tolist()) if c != f]
        for c, f in zip(xa.tolist(), xb.tolist()):
            ok = c == f or (xa.dtype.kind != "b" and key in RULED_ATTRS and self.mode.rule(int(c), int(f)))
            self.mode._observe("int", key, int(c), int(f), ok)
            if not ok:
                raise _Diff(_int_message(f"the constant array `{key}`", int(c), int(f)))
        return []


def _dense_values(attr):
    """The values of a dense constant, flattened (a splat's one value), or None."""
    import numpy as np

    if attr.is_splat:
        v = attr.get_splat_value()
        text = str(v).split(":")[0].strip()
        try:
            return np.array([int(text)] if re.fullmatch(r"-?\d+", text) else
                            [1 if text == "true" else 0] if text in ("true", "false") else [float(_float_value(text))])
        except (TypeError, ValueError):
            return None
    try:
        return np.asarray(attr).ravel()
    except Exception:  # noqa: BLE001 - e.g. bfloat16, which numpy does not know
        pass
    m = re.match(r'dense<"0x([0-9A-Fa-f]+)">', str(attr))
    element = str(attr.type.element_type)
    dtype = _np_dtype(element)
    if m and dtype is not None:
        return np.frombuffer(bytes.fromhex(m.group(1)), dtype=dtype).astype(np.float64)
    texts = re.findall(r"-?\d+\.\d*(?:e[+-]?\d+)?|0x[0-9A-F]+|-?\d+", str(attr).split(":")[0])
    values = [_float_value(t) for t in texts]
    return None if any(v is None for v in values) else np.array(values, dtype=np.float64)


class _Body:
    """Compares the bodies of two functions: aligned op by op, values matched as they are
    defined; at different sizes, with the documented equivalences for what is present at
    one size only (identity ops jax omits, Python loops unrolled per size)."""

    def __init__(self, pair: _Pair, fa: _Func, fb: _Func, fname: str, kernel: str = "", unit_axes=()):
        self.pair, self.fa, self.fb, self.fname, self.kernel = pair, fa, fb, fname, kernel
        self.aligned: dict[int, int] = {}  # op index in B -> the op of A aligned with it
        self.m: dict[int, set] = {}  # value id in A -> ids in B it may correspond to
        self.alias: dict[int, int] = {}  # value id in A -> the one it stands for (a dropped convert's operand)
        self.r: dict[int, set] = {}  # and back
        # Values of the full-size program known at the check size: constants, the grid index
        # of an axis with one step at the check size (0), and integer arithmetic on them.
        self.fold: dict[int, int] = dict(fb.const)
        if unit_axes and fb.nodes:
            for g in unit_axes:
                if g < len(fb.nodes[0].results):
                    self.fold[fb.nodes[0].results[g]] = 0

    def fail(self, node: _Node | None, what: str) -> None:
        self.pair.fail(self.fname, node, what, self.kernel)

    def link(self, v: int, w: int) -> None:
        self.m.setdefault(v, set()).add(w)
        self.r.setdefault(w, set()).add(v)

    def run(self) -> None:
        A, B = self.fa.nodes, self.fb.nodes
        if self.pair.kind == "platform":
            if self.pair.cpu_first:
                A = self.drop_cpu_dot_converts(A, B)
            for x, y in zip(A, B):
                if x.key != y.key:
                    self.mismatch(x, y)
                self.match(x, y)
            if len(A) != len(B):
                self.extra(A, B)
            return
        for tag, i1, i2, j1, j2 in _place(self._split(_align(A, B)), A, B):
            if tag == "equal":
                for x, y in zip(A[i1:i2], B[j1:j2]):
                    self.match(x, y)
                continue
            ok, why = True, None
            if i2 > i1:
                ok = self.elide(A[i1:i2], "A")
            if ok and j2 > j1:
                why = self.unroll(j1, j2) if i2 == i1 else "no loop"
                ok = why is None or self.elide(B[j1:j2], "B")
            if not ok:
                if why not in (None, "no loop"):
                    self.fail(B[j1], why)
                self.explain(A[i1:i2], B[j1:j2])

    def drop_cpu_dot_converts(self, A: list, B: list) -> list:
        """``A`` (the CPU program's ops) without the converts jax's CPU lowering puts before a
        mixed-precision ``dot_general`` (each operand converted to the result's type: bf16 to
        f32, or f32 to itself) where the TPU program, whose dot takes mixed operands, has
        none. The converts are exact; each dropped result stands for its operand."""
        users: dict[int, set] = {}
        for n in A:
            for v in n.operands:
                users.setdefault(v, set()).add(n.name)
        out, j = [], 0
        for x in A:
            y = B[j] if j < len(B) else None
            if (x.name == "stablehlo.convert" and (y is None or x.key != y.key) and len(x.operands) == 1
                    and _exact_float_convert(self.fa.value_type.get(x.operands[0], ""), x.types[0])
                    and users.get(x.results[0]) == {"stablehlo.dot_general"}):
                self.alias[x.results[0]] = self.alias.get(x.operands[0], x.operands[0])
                continue
            out.append(x)
            j += 1
        return out

    def _split(self, ops: list) -> list:
        """An insertion that starts by repeating the ops before it (a loop's extra
        iterations) and goes on with something else (the first extra iterations of the next
        loop, aligned at its end by ``_place``) is split in two."""
        out = []
        for op in ops:
            tag, i1, i2, j1, j2 = op
            if tag == "insert":
                length = self._continuation(j1, j2)
                if 0 < length < j2 - j1:
                    out += [("insert", i1, i1, j1, j1 + length), ("insert", i1, i1, j1 + length, j2)]
                    continue
            out.append(op)
        return out

    def _continuation(self, j1: int, j2: int) -> int:
        """How many of B[j1:j2] repeat, in whole periods, the ops just before j1."""
        for p in range(1, min(j2 - j1, j1, MAX_PERIOD) + 1):
            if all(self._repeats(t, p) for t in range(j1, j1 + p)):
                end = j1 + p
                while end + p <= j2 and all(self._repeats(t, p) for t in range(end, end + p)):
                    end += p
                return end - j1
        return 0

    # --- matching ---

    def match(self, x: _Node, y: _Node) -> None:
        if x.key != y.key:
            self.mismatch(x, y)
        if len(x.operands) != len(y.operands):
            self.fail(x, "it has a different number of operands")
        for k, (v, w) in enumerate(zip(x.operands, y.operands)):
            v = self.alias.get(v, v)
            if w not in self.m.get(v, ()) and not self.same_constant(v, w, x, k):
                self.fail(x, f"its operand #{k} is a different value in the two programs")
        try:
            for ta, tb in zip(x.types, y.types):
                self.pair.mode.types(ta, tb)
                for kind, xa, xb in self.pair.mode.numbers(ta, tb, "type", "a type"):
                    self.pair.mode.deferred.append(_Deferred(kind, xa, xb, (self.fname, x, self.kernel)))
        except _Diff as d:
            self.fail(x, str(d))
        if x.kind == "op":
            self.aligned[y.index] = x.index
            self.pair.attrs(x.op, y.op, self.fname, x, kernel=self.kernel)
            if x.name in PART_OPS and self.pair.kind == "size":
                self.whole_stays_whole(x, y)
        for v, w in zip(x.results, y.results):
            self.link(v, w)

    def whole_stays_whole(self, x: _Node, y: _Node) -> None:
        """A slice or load that takes a whole axis of its operand at the check size takes no
        less of it at full size: shapes are otherwise free, and a smaller part read where the
        check size reads everything is less work than the program that was checked."""
        (sa, ra), (sb, rb) = (_dims_of(self.fa.value_type[x.operands[0]]), _dims_of(x.types[0]) if x.types else []), \
            (_dims_of(self.fb.value_type[y.operands[0]]), _dims_of(y.types[0]) if y.types else [])
        if not (sa and ra and sb and rb) or not (len(sa[0]) == len(ra[0]) == len(sb[0]) == len(rb[0])):
            return
        for d, (s_c, r_c, s_f, r_f) in enumerate(zip(sa[0], ra[0], sb[0], rb[0])):
            if r_c == s_c and r_f < r_c:
                self.fail(x, f"at the check size it takes all {s_c} of its operand's axis {d}, but at full size only "
                             f"{r_f} of {s_f}: less read where the check size reads everything")

    def same_constant(self, v: int, w: int, user: _Node, k: int) -> bool:
        """Operand ``k`` of ``user``: constants the programs share (MLIR merges equal
        constants, so one constant at the check size may stand for several at full size) are
        compared as constants; and a full-size address computed from a grid index whose axis
        has one step at the check size may be the check size's constant there (``s * block``
        where the check size, specialized, has 0), in an address operand only."""
        if self.pair.kind != "size" or v not in self.fa.const:
            return False
        if _skeleton(self.fa.value_type[v]) != _skeleton(self.fb.value_type.get(w, "")):
            return False
        c = self.fa.const[v]
        if w in self.fb.const:
            return self.pair.mode.rule(c, self.fb.const[w])
        return self.fold.get(w) == c and user.name in ADDRESS_OPS and k >= 1

    def mismatch(self, x: _Node, y: _Node) -> None:
        a, b = self.pair.labels
        what = f"the {a} program has {_describe(x)} where the {b} program has {_describe(y)}"
        if x.kind == "op" and y.kind == "op" and x.name == y.name:
            what = (f"the {a} program's {_describe(x)} returns {_short(', '.join(x.types), 80) or 'nothing'} where the "
                    f"{b} program's returns {_short(', '.join(y.types), 80) or 'nothing'}")
            if x.shape != y.shape:
                what = f"its regions differ ({x.shape} vs {y.shape} blocks)"
        hint = PER_PLATFORM.get(x.name) or PER_PLATFORM.get(y.name)
        if hint and self.pair.kind == "platform":
            what += f" ({hint}; use it inside a Pallas kernel or write it with other ops)"
        self.fail(x if x.kind == "op" else y, what)

    def extra(self, A: list, B: list) -> None:
        a, b = self.pair.labels
        if len(A) > len(B):
            self.fail(A[len(B)], f"the {a} program has more ops here ({_describe(A[len(B)])} and after)")
        self.fail(B[len(A)], f"the {b} program has more ops here ({_describe(B[len(A)])} and after)")

    def explain(self, xs: list, ys: list) -> None:
        """Fail on a difference no equivalence explains, as precisely as possible."""
        a, b = self.pair.labels
        for x, y in zip(xs, ys):
            if x.key != y.key:
                self.mismatch(x, y)
        if len(xs) > len(ys):
            x = xs[len(ys)]
            self.fail(x, f"the {a} program has {len(xs) - len(ys)} op(s) here that the {b} program lacks, from "
                         f"{_describe(x)}")
        if len(ys) > len(xs):
            y = ys[len(xs)]
            self.pair.fail(self.fname, y, f"the {b} program has {len(ys) - len(xs)} op(s) here that the {a} program "
                                          f"lacks, from {_describe(y)}", self.kernel)
        for x, y in zip(xs, ys):
            self.match(x, y)

    # --- ops present at one size only ---

    def elide(self, nodes: list, side: str) -> bool:
        """Nodes of one program only (side "A": the check size, "B": full size), each an op
        that is the identity at the other size, or a constant only such ops use."""
        for n in nodes:
            if n.kind != "op" or len(n.results) != 1:
                return False
            if n.name in CONSTANT_OPS:
                continue  # unmatched: any later use by a matched op fails
            if side == "B" and n.name in FOLD_OPS:
                values = [self.fold.get(v) for v in n.operands]
                if any(v is None for v in values):
                    return False
                self.fold[n.results[0]] = FOLD_OPS[n.name](*values)
                continue
            if n.name not in VIEW_OPS | PAD_OPS | SLICE_OPS or not n.operands:
                return False
            if n.name in PAD_OPS and not self._nonnegative_pad(n):
                return False
            if n.name in SLICE_OPS and not self._identity_slice(n, side):
                return False
            src, out = n.operands[0], n.results[0]
            if side == "B":
                for v in list(self.r.get(src, ())):
                    self.link(v, out)
            else:
                for w in list(self.m.get(src, ())):
                    self.link(out, w)
        return True

    @staticmethod
    def _nonnegative_pad(n: _Node) -> bool:
        for k in ("edge_padding_low", "edge_padding_high", "interior_padding"):
            if k in n.op.attributes and any(int(x) < 0 for x in re.findall(r"-?\d+", str(n.op.attributes[k]))):
                return False
        return True

    def _identity_slice(self, n: _Node, side: str) -> bool:
        """A slice at one size that starts at 0 with stride 1 and, at the other size, would
        take the whole operand."""
        attrs = n.op.attributes
        for k in ("start_indices", "offsets"):
            if k in attrs and any(int(x) != 0 for x in re.findall(r"-?\d+", str(attrs[k]).split(":", 1)[-1])):
                return False
        strides = re.findall(r"-?\d+", str(attrs["strides"]).split(":", 1)[-1]) if "strides" in attrs else []
        if any(int(x) != 1 for x in strides):
            return False
        own = self.fa if side == "A" else self.fb
        other = self.fb if side == "A" else self.fa
        links = self.m if side == "A" else self.r
        result = _dims_of(n.types[0])
        source = _dims_of(own.value_type[n.operands[0]])
        counterparts = links.get(n.operands[0], ())
        if not result or not source or not counterparts:
            return False
        for v in counterparts:
            dims = _dims_of(other.value_type[v])
            if not dims or len(dims[0]) != len(result[0]):
                return False
            for r, s, o in zip(result[0], source[0], dims[0]):
                c, f = (r, o) if side == "A" else (o, r)
                if r != s and not self.pair.mode.rule(c, f):
                    return False
        return True

    def unroll(self, j1: int, j2: int) -> str | None:
        """Full-size ops B[j1:j2] that repeat the ops just before them: more iterations of a
        Python loop over a size (a kernel's ``for h in range(num_heads)``). The iteration
        counts must be size-derived, and every integer that differs between iterations must
        step by the same amount each time (an affine function of the loop index)."""
        B, d = self.fb.nodes, j2 - j1
        for p in range(1, d + 1):
            if d % p or j1 - p < 0:
                continue
            if all(self._repeats(t, p) for t in range(j1, j2)):
                break
        else:
            return "no loop"
        start = j1 - p  # count the iterations both sizes have
        while start - p >= 0 and all(self._repeats(t, p) for t in range(start, start + p)):
            start -= p
        k_check = (j1 - start) // p
        k_full = k_check + d // p
        if not self.pair.mode.rule(k_check, k_full):
            return (f"a repeated group of {p} ops (a Python loop) runs {k_check} times at the check size but "
                    f"{k_full} times at full size, which is not derived from the workload's dimensions")
        # Where an iteration begins is ambiguous when the code after the loop starts like an
        # iteration (constants): the boundary is the one at which the integers step evenly.
        why = self._steps(start, p, k_full)
        for o in range(1, p):
            if not why or start - o < 0 or not self._repeats(start - o + p, p):
                break
            why = self._steps(start - o, p, k_full) and why
        if why:
            return why
        for t in range(j1, j2):  # an extra iteration's op stands for its counterpart in the one before
            if B[t].kind == "op" and B[t - p].index in self.aligned:
                self.aligned[B[t].index] = self.aligned[B[t - p].index]
        shift: dict[int, int] = {}  # values of the last iteration both sizes have -> of the last one
        for q in range(j1 - p, j1):
            for k in range(len(B[q].results)):
                shift[self.fb.value_at[(q, k)]] = self.fb.value_at[(q + d, k)]
        for v, ws in list(self.m.items()):
            moved = {shift.get(w, w) for w in ws}
            if moved != ws:
                for w in ws - moved:
                    self.r.get(w, set()).discard(v)
                self.m[v] = moved
                for w in moved:
                    self.r.setdefault(w, set()).add(v)
        return None

    def _repeats(self, t: int, p: int) -> bool:
        """B[t] is B[t - p] one iteration later: same op, types and attributes up to
        integers, operands the same value or the one defined p nodes later."""
        B, fb = self.fb.nodes, self.fb
        x, y = B[t], B[t - p]
        if x.key != y.key or x.types != y.types or len(x.operands) != len(y.operands):
            return False
        if x.parent != y.parent and x.parent - y.parent != p:
            return False
        for v, w in zip(x.operands, y.operands):
            if v == w:
                continue
            if v < 0 or w < 0:
                return False
            (pv, kv), (pw, kw) = fb.defpos[v], fb.defpos[w]
            if pv - pw != p or kv != kw:
                return False
        if x.kind == "block":
            return True
        ka, kb = list(x.op.attributes), list(y.op.attributes)
        if ka != kb:
            return False
        for k in ka:
            sa, sb = str(x.op.attributes[k]), str(y.op.attributes[k])
            if sa == sb:
                continue
            ta, tb = _tokens(sa, k), _tokens(sb, k)
            if ta.skeleton != tb.skeleton or len(ta.numbers) != len(tb.numbers):
                return False
            for (kx, vx, key), (ky, vy, _) in zip(ta.numbers, tb.numbers):
                if vx != vy and (kx != "int" or ky != "int" or key not in RULED_ATTRS):
                    return False
        return True

    def _steps(self, start: int, p: int, count: int) -> str | None:
        """Every integer of the repeated ops steps by a constant from one iteration to the next."""
        B = self.fb.nodes
        for r in range(p):
            node = B[start + r]
            if node.kind != "op":
                continue
            for k in node.op.attributes:
                series = [_tokens(str(B[start + i * p + r].op.attributes[k]), k).numbers for i in range(count)]
                for q in range(len(series[0])):
                    values = [s[q][1] for s in series]
                    if len(set(values)) == 1:
                        continue
                    ints = [int(v) for v in values]
                    step = ints[1] - ints[0]
                    if any(b - a != step for a, b in zip(ints, ints[1:])):
                        return (f"a repeated group of ops (a Python loop) uses {_short(str(ints), 80)} in successive "
                                f"iterations at op #{node.index}, not a constant step: iterations may differ only "
                                f"by their index")
        return None


def _align(A: list, B: list) -> list:
    """Opcodes (difflib's) aligning two node lists by their keys: the common prefix and
    suffix first (so an insertion is placed where the programs diverge), then the rest."""
    import difflib

    n, m = len(A), len(B)
    pre = 0
    while pre < min(n, m) and A[pre].key == B[pre].key:
        pre += 1
    suf = 0
    while suf < min(n, m) - pre and A[n - 1 - suf].key == B[m - 1 - suf].key:
        suf += 1
    ops = [("equal", 0, pre, 0, pre)] if pre else []
    mid_a, mid_b = [x.key for x in A[pre:n - suf]], [y.key for y in B[pre:m - suf]]
    if mid_a or mid_b:
        if not mid_a:
            ops.append(("insert", pre, pre, pre, m - suf))
        elif not mid_b:
            ops.append(("delete", pre, n - suf, pre, pre))
        else:
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes():
                ops.append((tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre))
    if suf:
        ops.append(("equal", n - suf, n, m - suf, m))
    return ops


def _exact(x: _Node, y: _Node) -> bool:
    """Two aligned nodes with the same types and attributes, to the letter."""
    if x.types != y.types:
        return False
    if x.op is None or y.op is None:
        return x.op is y.op
    ka, kb = list(x.op.attributes), list(y.op.attributes)
    return ka == kb and all(str(x.op.attributes[k]) == str(y.op.attributes[k]) for k in ka)


def _place(ops: list, A: list, B: list) -> list:
    """Each insertion between two aligned runs moved to where the ops around it match best.

    Keys alone leave an insertion's place ambiguous where the ops after (or before) it
    start like it: extra iterations of an unrolled loop could be aligned before, among or
    after the ones both sizes have. Of the places keys allow, the one with the most aligned
    pairs identical to the letter (the same loop index, the code after the loop with the
    code after the loop) wins; ties go right (the extra iterations come last).
    """
    out = list(ops)
    k = 0
    while k < len(out) - 1:
        tag, i1, i2, j1, j2 = out[k]
        nxt = out[k + 1]
        if tag != "insert" or nxt[0] != "equal" or nxt[1] != i1 or nxt[3] != j2:
            k += 1
            continue
        prev = out[k - 1] if k else None
        can_left = prev is not None and prev[0] == "equal" and prev[2] == i1 and prev[4] == j1
        best, score, best_score = 0, 0, 0
        t = 0  # right: A[i1 + t] pairs with B[j1 + t] instead of B[j2 + t]
        while i1 + t < nxt[2] and j2 + t < len(B) and B[j1 + t].key == B[j2 + t].key:
            score += _exact(A[i1 + t], B[j1 + t]) - _exact(A[i1 + t], B[j2 + t])
            t += 1
            if score >= best_score:
                best, best_score = t, score
        score, t = 0, 0  # left: A[i1 - 1 - t] pairs with B[j2 - 1 - t] instead of B[j1 - 1 - t]
        while can_left and i1 - 1 - t >= prev[1] and j1 - 1 - t >= 0 and B[j1 - 1 - t].key == B[j2 - 1 - t].key:
            score += _exact(A[i1 - 1 - t], B[j2 - 1 - t]) - _exact(A[i1 - 1 - t], B[j1 - 1 - t])
            t += 1
            if score > best_score:
                best, best_score = -t, score
        if best > 0:  # the next run's first pairs now align with the insertion's first ops
            out[k:k + 2] = [("equal", i1, i1 + best, j1, j1 + best),
                            ("insert", i1 + best, i1 + best, j1 + best, j2 + best),
                            ("equal", i1 + best, nxt[2], j2 + best, nxt[4])]
            k += 2
        elif best < 0:  # the previous run's last pairs now align with the insertion's last ops
            out[k - 1:k + 1] = [("equal", prev[1], i1 + best, prev[3], j1 + best),
                                ("insert", i1 + best, i1 + best, j1 + best, j2 + best),
                                ("equal", i1 + best, i1, j2 + best, j2)]
            k += 2
        else:
            k += 1
    return [o for o in out if o[0] != "equal" or o[2] > o[1]]


def _kernel_shape(nodes: list[_Node], fname: str, label: str) -> None:
    """A TPU ``pallas_kernel_<n>``: one tpu_custom_call on its arguments, a return of its results."""
    ops = [n for n in nodes if n.kind == "op"]
    blocks = [n for n in nodes if n.kind == "block"]
    ok = (len(blocks) == 1 and len(ops) == 2 and ops[0].name == "stablehlo.custom_call"
          and _custom_target(ops[0].op) == TPU_TARGET and ops[1].name == "func.return")
    if ok:
        call = ops[0]
        ok = call.operands == blocks[0].results and set(ops[1].operands) <= set(call.results)
    if not ok:
        raise ProgramMismatch(f"function `{fname}` of the {label} program is not one Pallas kernel: a "
                              f"pallas_kernel_<n> function must be a single tpu_custom_call on its arguments, "
                              f"returning its results (found {[o.name for o in ops]})")


class _Kernels:
    """Compares the Mosaic kernels of two ``tpu_custom_call``s (check size vs full size)."""

    FREE_KEYS = frozenset({"cost_estimate", "scoped_memory_configs"})  # compiler hints, not semantics

    def __init__(self, pair: _Pair):
        self.pair = pair

    def compare(self, va, vb, fname: str) -> None:
        try:
            ja, jb = json.loads(_string_value_json(va)), json.loads(_string_value_json(vb))
        except ValueError as e:
            raise _Diff(f"its backend_config is not a Pallas kernel's ({e})") from None
        ba, bb = self.body(ja), self.body(jb)
        self.json(_without_body(ja), _without_body(jb), "backend_config")
        self.modules(ba, bb, fname)

    @staticmethod
    def body(cfg) -> bytes:
        import base64

        try:
            return base64.b64decode(cfg["custom_call_config"]["body"])
        except (KeyError, TypeError, ValueError):
            raise _Diff("its backend_config holds no Mosaic kernel body") from None

    def json(self, a, b, key: str) -> None:
        if type(a) is not type(b):
            raise _Diff(f"backend_config `{key}` differs: {_short(json.dumps(a))} vs {_short(json.dumps(b))}")
        if isinstance(a, dict):
            if sorted(a) != sorted(b):
                raise _Diff(f"backend_config `{key}` has keys {sorted(set(a) ^ set(b))} in one program only")
            for k in a:
                if k not in self.FREE_KEYS:
                    self.json(a[k], b[k], k)
        elif isinstance(a, list):
            if len(a) != len(b):
                raise _Diff(f"backend_config `{key}` differs in length")
            for x, y in zip(a, b):
                self.json(x, y, key)
        elif a != b:
            raise _Diff(f"backend_config `{key}` is {a!r} at the check size but {b!r} at full size")

    def modules(self, ba: bytes, bb: bytes, fname: str) -> None:
        from jaxbench_env.sim import mosaic

        try:
            ca, ma = mosaic.kernel_module(ba)
            cb, mb = mosaic.kernel_module(bb)
        except Exception as e:  # noqa: BLE001 - bytes from an untrusted process
            raise _Diff(f"its Mosaic kernel could not be read ({type(e).__name__}: {_short(str(e))})") from None
        self.pair.keep += [ca, cb]
        ops_a = [op.operation for op in ma.body.operations]
        ops_b = [op.operation for op in mb.body.operations]
        attrs_a = {k: str(ma.operation.attributes[k]) for k in ma.operation.attributes}
        attrs_b = {k: str(mb.operation.attributes[k]) for k in mb.operation.attributes}
        kernel = _sym(ops_a[0]) if ops_a else "?"
        if attrs_a != attrs_b:
            raise _Diff(f"its Mosaic modules' attributes differ ({attrs_a} vs {attrs_b})")
        if [(o.name, _sym(o)) for o in ops_a] != [(o.name, _sym(o)) for o in ops_b]:
            raise _Diff(f"its Mosaic modules define different functions: {[_sym(o) for o in ops_a]} vs "
                        f"{[_sym(o) for o in ops_b]}")
        aligned = self.pair.aligned.setdefault((kernel_key(ba), kernel_key(bb)), {})
        for fa, fb in zip(ops_a, ops_b):
            name = _sym(fa)
            label = fname if name == kernel else f"{fname}` > `{name}"
            self.pair.attrs(fa, fb, label, None, skip={"sym_name"}, kernel=kernel)
            bounds_a, bounds_b = _grid(fa), _grid(fb)
            unit = [g for g, (x, y) in enumerate(zip(bounds_a, bounds_b)) if x == 1 and y != 1]
            body = _Body(self.pair, _Func(name, fa), _Func(name, fb), label, kernel, unit)
            body.run()
            aligned.update(((name, b), a) for b, a in body.aligned.items())


def kernel_key(body: bytes) -> str:
    """A Mosaic kernel body's name in ``verify_artifacts``' alignment (``mosaic.CustomCall.body``)."""
    import hashlib

    return hashlib.sha256(body).hexdigest()


def _grid(func_op) -> list[int]:
    if "iteration_bounds" not in func_op.attributes:
        return []
    return [int(x) for x in re.findall(r"-?\d+", str(func_op.attributes["iteration_bounds"]).split(":", 1)[-1])]


def _string_value_json(attr) -> str:
    from jaxbench_env.sim.mosaic import _unescape_mlir

    return _unescape_mlir(_string_value(attr))


def _without_body(cfg: dict) -> dict:
    out = dict(cfg)
    if isinstance(out.get("custom_call_config"), dict):
        out["custom_call_config"] = {k: v for k, v in out["custom_call_config"].items() if k != "body"}
    return out


# --- CPU vs TPU: the kernels --------------------------------------------------------------------

def _check_kernel_signatures(pair: _Pair) -> None:
    cpu, tpu = pair.funcs
    for a, b in pair.kernel_pairs:
        if a not in cpu or b not in tpu:
            raise ProgramMismatch(f"kernel function `{a}` is missing from one of the check-size programs")
        _kernel_shape(_Func(b, tpu[b]).nodes, b, pair.labels[1])
        sa, sb = str(cpu[a].attributes["function_type"]), str(tpu[b].attributes["function_type"])
        if sa != sb:
            raise ProgramMismatch(f"kernel function `{a}` has signature {sa} in the {pair.labels[0]} program but {sb} "
                                  f"in the {pair.labels[1]} program")
    kernels_cpu = sorted(n for n in cpu if n.startswith(KERNEL_PREFIX))
    kernels_tpu = sorted(n for n in tpu if n.startswith(KERNEL_PREFIX))
    if kernels_cpu != kernels_tpu:
        raise ProgramMismatch(f"the check-size CPU and TPU programs have different kernels: {kernels_cpu} vs "
                              f"{kernels_tpu}")


# --- composites ------------------------------------------------------------------------------------

def _check_composites(module, funcs: dict, platform: str) -> None:
    """Each ``chlo.top_k`` composite's decomposition is exactly jax's for its operand."""
    for fname, fop in funcs.items():
        for op in _walk(fop):
            if op.name != "stablehlo.composite":
                continue
            decomposition = op.attributes["decomposition"].value
            if decomposition not in funcs:
                raise ProgramMismatch(f"composite in `{fname}` decomposes into `{decomposition}`, which is undefined")
            reference = _top_k_reference(op, platform)
            ref_funcs, ref_name = reference
            pair = _Pair("platform", ("jax's top_k", "the candidate's top_k"), (ref_funcs, funcs), _Same())
            pair.names[ref_name] = decomposition
            try:
                pair.function(ref_name, decomposition)
            except ProgramMismatch as e:
                raise ProgramMismatch(f"composite `chlo.top_k` in function `{fname}`{_line(op)} does not decompose "
                                      f"into jax's top_k: {e}") from None


_TOP_K_CACHE: dict = {}


def _top_k_reference(op, platform: str):
    """jax's own lowering of ``lax.top_k`` for this composite's operand and k: (functions, decomposition name)."""
    import numpy as np

    import jax
    from jax import export

    mlir, ir = _ir()
    operand_type = ir.RankedTensorType(op.operands[0].type)
    shape = tuple(operand_type.shape)
    dtype = _np_dtype(str(operand_type.element_type))
    attrs = str(op.attributes["composite_attributes"])
    m = re.search(r"k = (\d+)", attrs)
    if m is None or dtype is None:
        raise ProgramMismatch(f"a chlo.top_k composite with unexpected attributes {attrs} or type {operand_type}")
    key = (shape, str(dtype), int(m.group(1)), platform)
    if key not in _TOP_K_CACHE:
        k = int(m.group(1))
        exp = export.export(jax.jit(lambda x: jax.lax.top_k(x, k)), platforms=[platform])(
            jax.ShapeDtypeStruct(shape, np.dtype(dtype)))
        ctx = mlir.make_ir_context()
        module = _parse_module(exp, ctx)
        with ctx:
            funcs = _functions(module)
            names = [n for n in funcs if n.endswith(".impl")]
        _TOP_K_CACHE[key] = (ctx, module, funcs, names[0] if names else "")
    _, _, funcs, name = _TOP_K_CACHE[key]
    return funcs, name


def _np_dtype(mlir_type: str):
    import ml_dtypes
    import numpy as np

    table = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16", "i32": "int32",
             "i64": "int64", "ui8": "uint8", "ui32": "uint32"}
    if mlir_type == "bf16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(table[mlir_type]) if mlir_type in table else None


# --- the entry point -------------------------------------------------------------------------------

def _same_interface(programs: list, labels: list) -> None:
    first, label0 = programs[0], labels[0]
    for p, label in zip(programs[1:], labels[1:]):
        if p.in_tree != first.in_tree or p.out_tree != first.out_tree:
            raise ProgramMismatch(f"the {label} program's input/output structure differs from the {label0} program's")
        if [len(a.shape) for a in p.in_avals] != [len(a.shape) for a in first.in_avals] or \
                [str(a.dtype) for a in p.in_avals] != [str(a.dtype) for a in first.in_avals]:
            raise ProgramMismatch(f"the {label} program's inputs differ in rank or dtype from the {label0} program's")
        if [len(a.shape) for a in p.out_avals] != [len(a.shape) for a in first.out_avals] or \
                [str(a.dtype) for a in p.out_avals] != [str(a.dtype) for a in first.out_avals]:
            raise ProgramMismatch(f"the {label} program's outputs differ in rank or dtype from the {label0} program's")
        if tuple(p.module_kept_var_idx) != tuple(first.module_kept_var_idx):
            for (x, lx), (y, ly) in (((p, label), (first, label0)), ((first, label0), (p, label))):
                unread = sorted(set(x.module_kept_var_idx) - set(y.module_kept_var_idx))
                if unread:
                    raise ProgramMismatch(f"the {ly} program does not read input(s) {unread} that the {lx} program "
                                          f"reads: its result does not depend on them, so the two are not one "
                                          f"program (a Python branch on the input shapes?)")
        if p.calling_convention_version != first.calling_convention_version:
            raise ProgramMismatch(f"the {label} program's calling convention differs from the {label0} program's")


def verify_artifacts(full_tpu, check_tpu, check_cpu, full_config: Mapping[str, Any],
                     check_config: Mapping[str, Any], observe=None) -> dict:
    """Raise ``ProgramMismatch`` unless the three exported programs (``jax.export.Exported``;
    ``check_cpu`` may be None when the candidate's kernels cannot be interpreted) are one
    program: allowed ops only, the check-size CPU and TPU programs the same outside the
    Pallas kernels, and the full-size TPU program the check-size one up to sizes (module
    docstring). ``observe(kind, key, check_value, full_value, allowed)``, if given, sees
    every value that differs between the sizes (for tuning the rule).

    Returns how the Mosaic kernels' ops correspond: {(``kernel_key`` of a check-size kernel
    body, of the full-size one): {(function name, op index at full size): op index at the
    check size}}, op indices in preorder; an extra iteration of a Python loop unrolled more
    times at full size maps to the last iteration both sizes have, an op present at full
    size only (an identity, a constant) to nothing."""
    mlir, _ = _ir()
    programs = [(full_tpu, "tpu", "full-size TPU"), (check_tpu, "tpu", "check-size TPU")]
    if check_cpu is not None:
        programs.append((check_cpu, "cpu", "check-size CPU"))
    for exported, platform, label in programs:
        _check_exported(exported, platform, label)
    _same_interface([p for p, _, _ in programs], [label for _, _, label in programs])

    ctx = mlir.make_ir_context()
    modules = {label: _parse_module(exported, ctx) for exported, _, label in programs}
    with ctx:
        funcs = {}
        for exported, platform, label in programs:
            try:
                _check_module_ops(modules[label], platform)
            except ProgramMismatch as e:
                raise ProgramMismatch(str(e).replace(f"the {platform.upper()} program", f"the {label} program")) \
                    from None
            funcs[label] = _functions(modules[label])
            _check_composites(modules[label], funcs[label], platform)

        if check_cpu is not None:
            pair = _Pair("platform", ("check-size CPU", "check-size TPU"),
                         (funcs["check-size CPU"], funcs["check-size TPU"]), _Same(), cpu_first=True)
            pair.run()
            _check_kernel_signatures(pair)

        sized = _Sized(SizeRule(check_config, full_config), observe)
        pair = _Pair("size", ("check-size TPU", "full-size TPU"), (funcs["check-size TPU"], funcs["full-size TPU"]),
                     sized)
        pair.run()
        return pair.aligned
