"""The ops of a compiled v6e program, read from its optimized HLO text.

Each op the TPU runs as a unit (a fusion, a Mosaic kernel, a copy, ...) becomes an
``XlaOp`` with the HBM bytes it reads and writes and the FLOPs of its floating-point
matmuls and convolutions (nested fusions included: MXU work no clock runs faster than the
peak). Sizes use the compiled layout's tiling (a bf16 array's minor dimensions pad to
16x128 tiles, so a 62-wide image row costs a 128-wide one), and arrays the compiler placed
in VMEM (``S(1)``) or SMEM (``S(2)``) move no HBM bytes. Ops inside a ``while`` body count
once per iteration when the compiler knows the trip count; every branch of a
``conditional`` counts (an upper bound: the program runs one).

Asynchronous copies cost what they move: a ``copy-start`` or ``slice-start`` reads the
copied bytes where its source is in HBM and writes them where its destination is (a
prefetch into VMEM writes none); its output tuple repeats the source only as a handle, and
the matching ``*-done`` moves nothing. (At batch 1 XLA streams mid-size arrays into VMEM
in 4 MiB ``slice-start`` chunks: charged their operand and tuple, each cost ~3x the whole
array.)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
             "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](?:\{([^}]*)\})?")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*?)\)(, .*)?$")
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{$")
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
         "partition-id", "replica-id", "opt-barrier"}


@dataclass
class XlaOp:
    name: str
    opcode: str
    hbm_bytes: float
    times: int = 1  # runs per program (a while body's trip count)
    estimated_cycles: float | None = None  # the compiler's own estimate, where it gives one
    pallas: bool = False  # a pallas_call's kernel (priced step by step from its jaxpr)
    out_shapes: tuple = ()  # dims of each output array, to match kernels to their pallas_call
    generated: bool = False  # a Mosaic kernel the compiler wrote itself (online softmax)
    flops: float = 0.0  # floating-point matmul/convolution FLOPs of one run (MXU work)


@dataclass
class HloProgram:
    ops: list  # XlaOp
    notes: list  # what pricing had to assume
    unknown_trips: list  # while loops whose trip count the compiler does not record (body priced once)
    conditionals: list  # conditionals (every branch priced: an upper bound)


def _array_bytes(dtype: str, dims: str, layout: str | None) -> tuple[float, bool]:
    """(bytes with tile padding, whether it lives in HBM) of one array shape."""
    shape = [int(d) for d in dims.split(",") if d]
    layout = layout or ""
    space = re.search(r"S\((\d+)\)", layout)
    in_hbm = space is None or space.group(1) == "0"
    tile = re.search(r"T\(([\d,]+)\)", layout)
    minor_to_major = [int(d) for d in layout.split(":")[0].split(",") if d.strip().isdigit()]
    if tile and shape and len(minor_to_major) == len(shape):
        tdims = [int(t) for t in tile.group(1).split(",")]
        for t, axis in zip(reversed(tdims), minor_to_major):  # the tile's last dim is the most minor
            shape[axis] = -(-shape[axis] // t) * t
    return math.prod(shape) * _ITEMSIZE.get(dtype, 4), bool(in_hbm)


def shape_bytes(shape: str) -> float:
    """HBM bytes of a (possibly tuple) shape string."""
    total = 0.0
    for dtype, dims, layout in _ARRAY.findall(shape):
        nbytes, in_hbm = _array_bytes(dtype, dims, layout)
        total += nbytes if in_hbm else 0.0
    return total


def _async_copy_bytes(opcode: str, shape: str, source: str) -> float:
    """HBM bytes of a ``copy-start`` ((destination, source, context) tuple) or a
    ``slice-start`` (((source...), destination, context)); ``source``: the operand's shape."""
    arrays = _ARRAY.findall(shape)
    if len(arrays) < 2:
        return 0.0
    dst = arrays[0] if opcode == "copy-start" else arrays[-2]
    src = _ARRAY.findall(source)[:1] or [arrays[1]]
    moved, dst_in_hbm = _array_bytes(*dst)
    _, src_in_hbm = _array_bytes(*src[0])
    return moved * (int(src_in_hbm) + int(dst_in_hbm))


def _computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    comps, entry, current = {}, None, None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(2)
            comps[current] = []
            entry = current if m.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps, entry


def _estimated_cycles(attrs: str) -> float | None:
    m = re.search(r'"estimated_cycles":"(\d+)"', attrs)
    return float(m.group(1)) if m else None


def _trip_count(attrs: str, condition: list[str]) -> int | None:
    """The compiler's known trip count, else the bound of a ``counter < constant`` condition
    (a lax.map or fori_loop from 0 in steps of 1, as jax emits them)."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', attrs)
    if m:
        return int(m.group(1))
    constants = dict(re.findall(r"%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", "\n".join(condition)))
    for line in condition:
        c = re.search(r"compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT", line)
        if line.lstrip().startswith("ROOT") and c and c.group(1) in constants:
            return int(constants[c.group(1)])
    return None


_FLOAT = ("bf16", "f16", "f32", "f64", "f8")


def _dims(shape: str) -> list[int]:
    arrays = _ARRAY.findall(shape)
    return [int(d) for d in arrays[0][1].split(",") if d] if arrays else []


def _mxu_flops(shape: str, opcode: str, operand_shapes: list[str], attrs: str) -> float:
    """FLOPs of one floating-point ``dot`` or ``convolution`` (2 per multiply-add): each
    output element takes the contracted dims' product (a dot), or its input features times
    the window's taps that meet data (a convolution), multiply-adds. Integer matmuls are
    left out: their peak is not the bf16 one the bound uses."""
    if opcode not in ("dot", "convolution") or len(operand_shapes) < 2:
        return 0.0
    if not all(s.split("[")[0].strip("( ").startswith(_FLOAT) for s in operand_shapes[:2] if s):
        return 0.0
    out = math.prod(_dims(shape))
    if opcode == "dot":
        lhs = _dims(operand_shapes[0])
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
        axes = [int(a) for a in contracting.group(1).split(",") if a] if contracting else []
        return 2.0 * out * math.prod(lhs[a] for a in axes if a < len(lhs))
    lhs, kernel = _dims(operand_shapes[0]), _dims(operand_shapes[1])
    labels = re.search(r"dim_labels=(\w+)_(\w+)->", attrs)
    if not labels or len(labels.group(2)) != len(kernel) or "i" not in labels.group(2):
        return 0.0
    lhs_labels, kernel_labels = labels.groups()
    # A window meets data at no more taps than the input has positions, and on an input
    # dilated d times at every d-th tap only. XLA writes matmuls as such windows: a batch
    # as a window over a dilated batch, a weight's extra dim (experts) as a window over a
    # size-1 input padded around; one tap per output either way.
    window = re.search(r"window=\{([^}]*)\}", attrs)
    dilate = re.search(r"lhs_dilate=([\dx]+)", window.group(1)) if window else None
    dilations = [int(d) for d in dilate.group(1).split("x")] if dilate else []
    macs = kernel[kernel_labels.index("i")]
    for label, size in zip(kernel_labels, kernel):
        if label.isdigit():
            d = dilations[int(label)] if int(label) < len(dilations) else 1
            positions = lhs[lhs_labels.index(label)] if label in lhs_labels and len(lhs) == len(lhs_labels) else size
            macs *= min(-(-size // d), positions)
    return 2.0 * out * macs


def _parse(line: str):
    """(name, shape, opcode, operand names, attributes) of one instruction line, or None."""
    m = _INSTR.match(line)
    if not m:
        return None
    return m.group(1), m.group(2), m.group(3), re.findall(r"%([\w.\-]+)", m.group(4)), m.group(5) or ""


def _fused(comps: dict, comp: str, memo: dict) -> tuple[dict[int, float], float | None, float]:
    """What one run of a fused computation really moves and computes: per parameter read
    only through slices (a window of a big buffer), the bytes of those slices; for an
    in-place ``dynamic-update-slice`` root, the update's bytes as the write (its buffer is
    not read), else None; and its MXU FLOPs, nested fusions included. Parameters used whole
    are left out (the caller counts their full size)."""
    if comp in memo:
        return memo[comp]
    memo[comp] = ({}, None, 0.0)  # a cycle guard; HLO computations do not recurse
    instrs = [x for x in map(_parse, comps.get(comp, ())) if x]
    shapes = {name: shape for name, shape, *_ in instrs}
    flops = 0.0
    for name, shape, opcode, operands, attrs in instrs:
        flops += _mxu_flops(shape, opcode, [shapes.get(o, "") for o in operands], attrs)
        called = re.search(r"calls=%([\w.\-]+)", attrs) if opcode == "fusion" else None
        if called:
            flops += _fused(comps, called.group(1), memo)[2]
    root = next((_parse(ln) for ln in comps.get(comp, ()) if ln.lstrip().startswith("ROOT")), None)
    params = {m.group(1): int(m.group(4)) for m in map(_INSTR.match, comps.get(comp, ()))
              if m and m.group(3) == "parameter"}
    windowed: dict[int, float] = {}
    for pname, index in params.items():
        total, whole = 0.0, False
        for name, shape, opcode, operands, attrs in instrs:
            for pos, operand in enumerate(operands):
                if operand != pname:
                    continue
                if opcode in ("dynamic-slice", "slice") and pos == 0:
                    total += shape_bytes(shape)
                elif opcode == "dynamic-update-slice" and pos == 0 and root and name == root[0]:
                    pass  # updated in place: not read
                elif opcode == "fusion" and re.search(r"calls=%([\w.\-]+)", attrs):
                    inner = _fused(comps, re.search(r"calls=%([\w.\-]+)", attrs).group(1), memo)[0]
                    if pos in inner:
                        total += inner[pos]
                    else:
                        whole = True
                else:
                    whole = True
        if not whole:
            windowed[index] = total
    out = None
    if root and root[2] == "dynamic-update-slice" and len(root[3]) > 1:
        out = shape_bytes(shapes.get(root[3][1], ""))
    memo[comp] = (windowed, out, flops)
    return memo[comp]


def program_ops(text: str) -> HloProgram:
    """The entry computation's ops (and those of its while bodies and branches), with what was guessed."""
    comps, entry = _computations(text)
    program = HloProgram([], [], [], [])
    notes, ops = program.notes, program.ops

    memo: dict = {}

    def walk(comp: str, times: int) -> None:
        shapes: dict[str, str] = {}
        for line in comps.get(comp, ()):
            parsed = _parse(line)
            if not parsed:
                continue
            name, shape, opcode, operands, attrs = parsed
            shapes[name] = shape
            if opcode == "while":
                body = re.search(r"body=%([\w.\-]+)", attrs)
                cond = re.search(r"condition=%([\w.\-]+)", attrs)
                trip = _trip_count(attrs, comps.get(cond.group(1), []) if cond else [])
                if trip is None:
                    program.unknown_trips.append(name)
                    notes.append(f"while loop {name}: trip count unknown, its body priced once")
                if body:
                    walk(body.group(1), times * (trip or 1))
                continue
            if opcode == "conditional":
                branches = re.findall(r"(?:branch_computations=\{|true_computation=|false_computation=|, )%([\w.\-]+)",
                                      attrs.split(", metadata=")[0])
                program.conditionals.append(name)
                notes.append(f"conditional {name}: all {len(branches)} branches priced (an upper bound: one runs)")
                for branch in branches:
                    walk(branch, times)
                continue
            if opcode in _FREE or opcode.endswith("-done") or 'custom_call_target="AllocateBuffer"' in attrs:
                continue  # allocation, and the end of an async copy, move no bytes
            if opcode in ("copy-start", "slice-start"):
                nbytes = _async_copy_bytes(opcode, shape, shapes.get(operands[0], "") if operands else "")
                ops.append(XlaOp(name, opcode, nbytes, times, _estimated_cycles(attrs)))
                continue
            read = [shape_bytes(shapes.get(o, "")) for o in operands]
            write = shape_bytes(shape)
            called = re.search(r"calls=%([\w.\-]+)", attrs)
            flops = _mxu_flops(shape, opcode, [shapes.get(o, "") for o in operands], attrs)
            if opcode == "fusion" and called:
                windowed, out, inner_flops = _fused(comps, called.group(1), memo)
                flops += inner_flops
                read = [min(b, windowed.get(i, b)) for i, b in enumerate(read)]
                write = write if out is None else min(write, out)
            elif opcode in ("dynamic-slice", "slice") and read:
                read = [write] + read[1:]
            elif opcode == "dynamic-update-slice" and len(read) > 1:
                read, write = [0.0] + read[1:], read[1]
            # Pallas kernels carry kernel_metadata; the compiler's own Mosaic kernels
            # (online-softmax) do not.
            mosaic = 'custom_call_target="tpu_custom_call"' in attrs
            pallas = mosaic and "kernel_metadata=" in attrs
            out_shapes = tuple(tuple(int(d) for d in dims.split(",") if d) for _, dims, _ in _ARRAY.findall(shape))
            ops.append(XlaOp(name, opcode, sum(read) + write, times, _estimated_cycles(attrs), pallas, out_shapes,
                             generated=mosaic and not pallas, flops=flops))

    if entry is None:
        notes.append("no ENTRY computation in the compiled HLO")
        return program
    walk(entry, 1)
    return program
