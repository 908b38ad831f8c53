"""The candidate's side of the trust boundary: load its module, trace it, export the programs.

This code runs in the sandboxed process that executes candidate Python (``sandbox.py``),
so nothing here decides anything: it produces artifacts, and the judge (``judge.py``)
verifies, runs, compiles and prices them. ``workload`` is traced once per size in the same
neutral context (no interpret mode, no special device), and the already-traced programs
are exported, never re-traced:

- ``full_tpu``: the full-size program for TPU, the one the judge compiles and prices;
- ``check_tpu``: the check-size program for TPU, which the judge compares with it;
- ``check_cpu``: the same check-size jaxpr with every ``pallas_call`` re-issued with
  ``interpret=True`` (jax's generic HLO interpreter), which the judge runs on its inputs.

In the exported programs every ``pallas_call`` is wrapped in a function of its own named
``pallas_kernel_<n>``, so the judge can compare everything outside the kernels op by op.
"""

from __future__ import annotations

import itertools
import sys
import time
import traceback
import types
from typing import Any, Mapping

KERNEL_PREFIX = "pallas_kernel_"
CANDIDATE_FILE = "<candidate>"
MAX_ERROR_CHARS = 2000
# Primitives that only print or log: stripped before export (they cannot change outputs).
DEBUG_PRIMITIVES = frozenset({"debug_print", "debug_callback"})

_module_ids = itertools.count()


class CandidateError(Exception):
    """The candidate failed a stage; the message is what the user sees."""


def short(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[: MAX_ERROR_CHARS // 2] + "\n...\n" + msg[-MAX_ERROR_CHARS // 2:]
    return msg


def candidate_frames(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == CANDIDATE_FILE]
    return "".join(f"  candidate line {f.lineno}, in {f.name}\n" for f in frames[-3:])


def load_module(source: str, config: Mapping[str, Any], schedule: Mapping[str, Any]) -> types.ModuleType:
    """Execute the candidate's source as a module registered in ``sys.modules`` (under a
    unique name), so dataclasses, ``typing.get_type_hints`` and pickling by reference work
    as in a file imported normally. ``CONFIG`` is set to the environment's config, and the
    schedule is merged over the module's own ``SCHEDULE``."""
    name = f"jaxbench_candidate_{next(_module_ids)}"
    module = types.ModuleType(name)
    module.__file__ = CANDIDATE_FILE
    sys.modules[name] = module
    try:
        exec(compile(source, CANDIDATE_FILE, "exec"), module.__dict__)
    except SyntaxError as e:
        raise CandidateError(f"syntax error at line {e.lineno}: {e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - candidate code may raise anything
        raise CandidateError(f"import failed: {short(e)}\n{candidate_frames(e)}") from None
    if not callable(getattr(module, "workload", None)):
        raise CandidateError("the module defines no callable `workload(*inputs)`")
    module.CONFIG = dict(config)
    own = getattr(module, "SCHEDULE", None)
    if isinstance(own, dict):
        own.update(schedule)
    elif schedule:
        module.SCHEDULE = dict(schedule)
    return module


def entry_point(module, wl, config, n_inputs: int):
    """``module.workload``, or, when the workload declares JAXBench's own signature
    (``wl.jaxbench_signature``) and the candidate's ``workload`` requires exactly that many
    positional parameters (not ``n_inputs``), a function of the inputs that calls it with the
    arguments the declared adapter makes from them. The adapter is traced with the candidate,
    so its ops are part of the candidate's program."""
    import inspect

    fn, declared = module.workload, wl.jaxbench_signature(config)
    if declared is None:
        return fn
    n_params, adapt = declared
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) != n_params or n_params == n_inputs:
        return fn
    return lambda *inputs: fn(*adapt(*inputs))


def trace(fn, specs):
    """(closed jaxpr, output tree) of ``fn`` at ``specs``: the candidate's Python runs here, once."""
    import jax

    traced = jax.jit(fn).trace(*specs)
    return traced.jaxpr, jax.tree_util.tree_structure(traced.out_info)


def _map_jaxpr(jaxpr, eqn_fn):
    """``jaxpr`` with ``eqn_fn(eqn)`` (a list of equations) in place of each equation, in
    nested jaxprs too (loop bodies, branches, calls)."""
    from jax._src import core

    def sub(p):
        if isinstance(p, core.ClosedJaxpr):
            return p.replace(jaxpr=_map_jaxpr(p.jaxpr, eqn_fn))
        if isinstance(p, core.Jaxpr):
            return _map_jaxpr(p, eqn_fn)
        if isinstance(p, tuple) and any(isinstance(x, (core.Jaxpr, core.ClosedJaxpr)) for x in p):
            return tuple(sub(x) for x in p)
        return p

    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "pallas_call":
            eqn = eqn.replace(params={k: sub(v) for k, v in eqn.params.items()})
        eqns.extend(eqn_fn(eqn))
    return jaxpr.replace(eqns=eqns)


def strip_debug(closed):
    """``closed`` without ``jax.debug.print``/``jax.debug.callback`` equations (they have no
    outputs, so nothing downstream reads them)."""
    return closed.replace(jaxpr=_map_jaxpr(closed.jaxpr, lambda e: [] if e.primitive.name in DEBUG_PRIMITIVES else [e]))


def wrap_kernels(closed, interpret: bool):
    """``closed`` with each ``pallas_call`` inside a jit of its own named
    ``pallas_kernel_<n>`` (numbered in order), its ``interpret`` flag set as given."""
    import jax
    from jax._src import core

    counter = itertools.count()

    def wrap(eqn):
        if eqn.primitive.name != "pallas_call":
            return [eqn]
        params = {**eqn.params, "interpret": interpret}
        prim = eqn.primitive

        def kernel(*args):
            return prim.bind(*args, **params)

        kernel.__name__ = kernel.__qualname__ = f"{KERNEL_PREFIX}{next(counter)}"
        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
        inner = jax.jit(kernel, inline=False).trace(*specs).jaxpr
        call = jax.jit(lambda *a: jax.jit(kernel, inline=False)(*a)).trace(*specs).jaxpr.jaxpr.eqns[0]
        assert call.params["jaxpr"].jaxpr.eqns[0].primitive.name == "pallas_call", inner
        return [call.replace(invars=eqn.invars, outvars=eqn.outvars, ctx=eqn.ctx,
                             source_info=eqn.source_info, effects=eqn.effects)]

    return core.ClosedJaxpr(_map_jaxpr(closed.jaxpr, wrap), closed.consts)


def export(closed, out_tree, specs, platform: str) -> bytes:
    """Serialize the traced program ``closed`` (returning ``out_tree``) for ``platform``
    ("tpu" or "cpu")."""
    import jax
    from jax import export as jax_export
    from jax.extend import core as jex_core

    run = jex_core.jaxpr_as_fun(closed)
    fn = jax.jit(lambda *args: jax.tree_util.tree_unflatten(out_tree, run(*args)))
    if platform == "tpu":
        from jaxbench_env.aot import v6e_device

        with jax.default_device(v6e_device()):  # some Mosaic lowering rules ask the default device
            exported = jax_export.export(fn, platforms=["tpu"])(*specs)
    else:
        exported = jax_export.export(fn, platforms=[platform])(*specs)
    return bytes(exported.serialize())


def input_specs(wl, config) -> list:
    import jax

    return list(jax.eval_shape(lambda: wl.make_inputs(config, 0)))


def build_artifacts(request: Mapping[str, Any]) -> tuple[dict, dict[str, bytes]]:
    """Load, trace and export one candidate. Returns (manifest, artifacts): the manifest is
    JSON-able (the check rung used, stage times, or the error), artifacts are bytes."""
    import workloads

    wl = workloads.get(request["workload"], request.get("config"))
    manifest: dict = {"stage": "load", "error": None, "stage_s": {}}
    blobs: dict[str, bytes] = {}
    try:
        t0 = time.perf_counter()
        module = load_module(request["source"], wl.config, request.get("schedule") or {})
        manifest["stage"] = "trace"
        full_specs = input_specs(wl, wl.config)
        module.CONFIG = dict(wl.config)
        try:
            full, out_tree = trace(entry_point(module, wl, wl.config, len(full_specs)), full_specs)
            full = strip_debug(full)
        except Exception as e:  # noqa: BLE001
            raise CandidateError(f"tracing workload at full size failed: {short(e)}\n{candidate_frames(e)}") from None
        check, rung, failures = None, None, []
        first = request.get("min_rung", 0)
        for rung, config in list(enumerate(wl.check_rungs()))[first:]:
            module.CONFIG = dict(config)  # the config of the size being traced
            try:
                specs = input_specs(wl, config)
                check, check_tree = trace(entry_point(module, wl, config, len(specs)), specs)
                check = strip_debug(check)
                break
            except Exception as e:  # noqa: BLE001 - a size-dependent assertion: climb a rung
                failures.append(f"rung {rung} {wl.shrunk(config)}: {short(e)}")
        if check is None:
            raise CandidateError("tracing workload failed at every check size:\n" + "\n".join(failures))
        check_specs = input_specs(wl, config)
        manifest.update(rung=rung, check_config=config, rung_failures=failures)
        manifest["stage_s"]["trace"] = time.perf_counter() - t0
        manifest["stage"] = "export"
        t1 = time.perf_counter()
        try:
            blobs["full_tpu"] = export(wrap_kernels(full, False), out_tree, full_specs, "tpu")
            blobs["check_tpu"] = export(wrap_kernels(check, False), check_tree, check_specs, "tpu")
        except Exception as e:  # noqa: BLE001
            raise CandidateError(f"v6e compile failed while lowering: {short(e)}") from None
        try:
            blobs["check_cpu"] = export(wrap_kernels(check, True), check_tree, check_specs, "cpu")
        except Exception as e:  # noqa: BLE001
            manifest["interpret_error"] = short(e)  # the judge decides what that means
        manifest["stage_s"]["export"] = time.perf_counter() - t1
        manifest["stage"] = "done"
    except CandidateError as e:
        manifest["error"] = str(e)
    except BaseException as e:  # noqa: BLE001 - whatever the candidate did, answer
        manifest["error"] = f"{manifest['stage']} stage failed: {short(e)}"
    return manifest, blobs


def preload() -> None:
    """What a sandbox's pre-warmed process does once, before it forks candidates: import
    jax and the workloads, load the v6e topology (the TPU exports need it) and trace one
    template, which warms jax's tracing caches. It must not lower, compile or run anything:
    a child forked after that deadlocks in XLA's thread pools."""
    from jaxbench_env.aot import prepare_process

    prepare_process("sim")
    import workloads
    from jaxbench_env import pallas_compat
    from jaxbench_env.aot import v6e_device

    pallas_compat.install()  # kernels written against earlier jax releases' Pallas names

    v6e_device()
    gemm = workloads.get("gemm", {"M": 256, "K": 256, "N": 256})
    module = load_module(gemm.template_source(), gemm.config, {"block_m": 128, "block_k": 128, "block_n": 128})
    trace(module.workload, input_specs(gemm, gemm.config))
