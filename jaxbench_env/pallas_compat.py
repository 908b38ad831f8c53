"""Pallas TPU names that recent jax releases renamed, resolvable again where candidates load.

Kernels written against an earlier jax (published LLM-written JAXBench kernels among them)
use names this project's jax no longer has. ``install()`` (called in the candidate's
process before its module runs) binds each old name below to its successor, and makes an
``AttributeError`` on ``pl.``/``pltpu.`` say which name this jax uses. Facts from the Pallas
changelog (docs.jax.dev/en/latest/pallas/CHANGELOG.html).
"""

from __future__ import annotations

import difflib

# (module, old name, module of the successor, its name, what happened to the old name)
RENAMED = (
    ("tpu", "TPUCompilerParams", "tpu", "CompilerParams", "renamed in jax 0.7.0, removed in 0.8.1"),
    ("tpu", "TPUMemorySpace", "tpu", "MemorySpace", "renamed in jax 0.7.0, removed in 0.8.1"),
    ("tpu", "KernelType", "tpu", "CoreType", "renamed in jax 0.9, later removed"),
    ("tpu", "ANY", "pallas", "ANY", "moved to pl.ANY; removed from pltpu in jax 0.10.0"),
    ("tpu", "delay", "pallas", "delay", "moved to pl.delay; removed from pltpu in jax 0.10.0"),
)
_PREFIX = {"pallas": "pl", "tpu": "pltpu"}


def _modules() -> dict:
    from jax.experimental import pallas
    from jax.experimental.pallas import tpu

    return {"pallas": pallas, "tpu": tpu}


def install() -> list[str]:
    """Bind the old names this jax lacks; returns those bound."""
    mods = _modules()
    bound = []
    for mod, old, new_mod, new, _ in RENAMED:
        target = getattr(mods[new_mod], new, None)
        if target is not None and old not in vars(mods[mod]):
            setattr(mods[mod], old, target)
            bound.append(f"{_PREFIX[mod]}.{old}")
    for key, module in mods.items():
        _explain_missing(module, _PREFIX[key], mods)
    return bound


def _explain_missing(module, prefix: str, mods: dict) -> None:
    """``module.__getattr__`` raising an AttributeError that names the likely current name."""
    inner = vars(module).get("__getattr__")
    if getattr(inner, "_jaxbench_explains", False):
        return

    def __getattr__(name):
        try:
            if inner is None:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            return inner(name)
        except AttributeError as e:
            aliases = {old for _, old, *_ in RENAMED}
            hints = [f"{_PREFIX[k]}.{m}" for k, mod in mods.items() for m in difflib.get_close_matches(
                name, [n for n in dir(mod) if not n.startswith("_") and n not in aliases], 2)]
            import jax

            hint = f"; this jax ({jax.__version__}) has {', '.join(hints)}" if hints else ""
            raise AttributeError(f"{prefix}.{name} does not exist{hint}") from e

    __getattr__._jaxbench_explains = True
    module.__getattr__ = __getattr__
