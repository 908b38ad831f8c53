"""Pallas TPU kernels as the compiler receives them: Mosaic modules inside ``tpu_custom_call``s.

A ``pallas_call`` lowered for TPU becomes a ``tpu_custom_call`` whose backend config holds
the kernel as serialized Mosaic MLIR (bytecode, base64). Everything the simulator and the
judge need to know about a kernel is in that module: the grid (``iteration_bounds``), one
window per operand (block shape and index map, ``window_params``), scalar prefetch and
scratch operands, and the body. Reading kernels from the artifact, not from a jaxpr the
candidate's process built, is what lets the judge price what it compiled itself.

This file finds the calls in StableHLO text (an exported program) or compiled HLO text,
and decodes their modules.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass

TARGET = "tpu_custom_call"


@dataclass(frozen=True)
class CustomCall:
    """One ``tpu_custom_call``: where it is, its operand and result types, its kernel."""

    name: str  # the HLO op name (compiled HLO) or "" (StableHLO)
    operands: tuple  # ((dims...), dtype) per operand
    results: tuple  # ((dims...), dtype) per result
    config: dict  # the backend config (JSON)

    @property
    def body(self) -> bytes:
        """The Mosaic module, serialized (MLIR bytecode)."""
        return base64.b64decode(self.config["custom_call_config"]["body"])


def _unescape_mlir(s: str) -> str:
    """An MLIR string literal's contents (``\\22`` is a quote, ``\\\\`` a backslash)."""
    return re.sub(r"\\(\\|[0-9A-Fa-f]{2})", lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1), 16)), s)


_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
_HLO_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def _tensor_types(text: str) -> tuple:
    return tuple((tuple(int(d) for d in dims.split("x") if d), dtype) for dims, dtype in _TENSOR.findall(text))


def stablehlo_custom_calls(module_text: str) -> list[CustomCall]:
    """The ``tpu_custom_call``s of a StableHLO module (``Exported.mlir_module()``), in order."""
    calls = []
    for m in re.finditer(r"stablehlo\.custom_call @" + TARGET + r"\(.*?\) \{(.*?)\} : \((.*?)\) -> (.*?)(?: loc\(|\n)",
                         module_text):
        attrs, ins, outs = m.groups()
        cfg = re.search(r'backend_config = "((?:[^"\\]|\\.)*)"', attrs)
        if cfg is None:
            raise ValueError("a tpu_custom_call without a backend_config")
        calls.append(CustomCall("", _tensor_types(ins), _tensor_types(outs), json.loads(_unescape_mlir(cfg.group(1)))))
    return calls


def hlo_custom_calls(hlo_text: str) -> list[CustomCall]:
    """The ``tpu_custom_call``s of a compiled HLO module (``compiled.as_text()``), in order."""
    calls = []
    decoder = json.JSONDecoder()
    for line in hlo_text.splitlines():
        if f'custom_call_target="{TARGET}"' not in line:
            continue
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) custom-call\((.*?)\)", line)
        start = line.find("backend_config=")
        if m is None or start < 0:
            continue
        config, _ = decoder.raw_decode(line[start + len("backend_config="):])
        operands = tuple((tuple(int(d) for d in dims.split(",") if d), dt)
                         for dt, dims in _HLO_ARRAY.findall(m.group(3)))
        results = tuple((tuple(int(d) for d in dims.split(",") if d), dt)
                        for dt, dims in _HLO_ARRAY.findall(m.group(2)))
        calls.append(CustomCall(m.group(1), operands, results, config))
    return calls


def kernel_module(body: bytes):
    """The Mosaic module parsed into MLIR's Python objects (ops in generic form, names
    prefixed ``stable_mosaic.``). Returns (context, module): keep the context alive."""
    from jax._src.lib import tpu
    from jax._src.lib.mlir import ir

    ctx = ir.Context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    with ctx:
        return ctx, ir.Module.parse(body)


def kernel_text(body: bytes) -> str:
    """The Mosaic module as MLIR text (generic form), without source locations."""
    ctx, module = kernel_module(body)
    with ctx:
        return module.operation.get_asm(enable_debug_info=False)
