"""The stages of one evaluation, run inside the sandbox worker process.

load the candidate module -> compile for v6e at full size (AOT, libtpu) -> check
correctness at check size in Pallas interpret mode (natively at full size on a TPU) ->
time it (simulate on "sim", measure on "tpu"). Each stage turns a failure into a readable
message in the result; nothing here raises to the caller.
"""

from __future__ import annotations

import time
import traceback
import types
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

import workloads
from jaxbench_env.sim import V6E, bundles, predict_program
from jaxbench_env.sim.pallas import pallas_call_eqns, vmem_estimate, vmem_limit
from jaxbench_env.aot import compile_for_v6e

N_SEEDS = 3
MAX_ERROR_CHARS = 2000

_inputs_cache: dict = {}  # (workload, config, seed) -> Expected
_reference_fns: dict = {}  # (workload, config) -> the jitted reference


class StageError(Exception):
    """A candidate failed a stage; the message is what the user sees."""


def _short(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[: MAX_ERROR_CHARS // 2] + "\n...\n" + msg[-MAX_ERROR_CHARS // 2:]
    return msg


def load_module(source: str, config: Mapping[str, Any], schedule: Mapping[str, Any]) -> types.ModuleType:
    module = types.ModuleType("candidate")
    module.__file__ = "<candidate>"
    try:
        exec(compile(source, "<candidate>", "exec"), module.__dict__)
    except SyntaxError as e:
        raise StageError(f"syntax error at line {e.lineno}: {e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - candidate code may raise anything
        raise StageError(f"import failed: {_short(e)}\n{_candidate_frames(e)}") from None
    if not callable(getattr(module, "workload", None)):
        raise StageError("the module defines no callable `workload(*inputs)`")
    module.CONFIG = dict(config)  # the env's shapes win over the candidate's own CONFIG
    own = getattr(module, "SCHEDULE", None)
    if isinstance(own, dict):
        own.update(schedule)
    elif schedule:
        module.SCHEDULE = dict(schedule)
    return module


def _candidate_frames(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<candidate>"]
    return "".join(f"  candidate line {f.lineno}, in {f.name}\n" for f in frames[-3:])


def check_structure(out, ref) -> None:
    import jax

    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if out_tree != ref_tree:
        raise StageError(f"output structure {out_tree} does not match the reference's {ref_tree}")
    for o, r in zip(out_leaves, ref_leaves):
        if tuple(np.shape(o)) != tuple(np.shape(r)):
            raise StageError(f"output shape {tuple(np.shape(o))} does not match the reference's {tuple(np.shape(r))}")
        if np.dtype(o.dtype) != np.dtype(r.dtype):
            raise StageError(f"output dtype {np.dtype(o.dtype)} does not match the reference's {np.dtype(r.dtype)}")


def compare_outputs(out, ref, atol: float, rtol: float) -> float:
    """Max abs error; raises StageError when not allclose or not finite."""
    import jax

    worst = 0.0
    for o, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        o32 = np.asarray(o, dtype=np.float32)
        r32 = np.asarray(r, dtype=np.float32)
        if not np.all(np.isfinite(o32)):
            raise StageError(f"output has {int(np.sum(~np.isfinite(o32)))} NaN/Inf values")
        err = np.abs(o32 - r32)
        worst = max(worst, float(err.max()) if err.size else 0.0)
        bad = ~(err <= atol + rtol * np.abs(r32))
        if bad.any():
            raise _Mismatch(worst, f"wrong result: {int(bad.sum())} of {bad.size} values outside atol={atol}, "
                            f"rtol={rtol}; max abs error {worst:.4g}")
    return worst


class _Mismatch(StageError):
    def __init__(self, max_abs_err: float, msg: str):
        super().__init__(msg)
        self.max_abs_err = max_abs_err


@dataclass(frozen=True)
class Expected:
    """What a candidate's output for one seed is judged against."""

    inputs: tuple
    ref: Any  # the reference's output: the candidate must match its structure, shapes and dtypes
    target: Any  # the values compared with: ``ref``, or its float32 computation (below)
    atol: float
    rtol: float


# How far a low-precision reference's own error must stay inside the tolerance (see expected()).
NOISE_MARGIN = 2.0


def _jitted_reference(wl: workloads.Workload, config: dict):
    import jax

    at = (wl.name, repr(sorted(config.items())))
    if at not in _reference_fns:  # one jit per config, so the seeds share its compilation
        _reference_fns[at] = jax.jit(lambda *a: wl.reference(config, *a))
    return _reference_fns[at]


def _tolerance_used(out, target, atol: float, rtol: float) -> float:
    """max |out - target| / (atol + rtol |target|): 1 is the edge of allclose."""
    o, t = np.asarray(out, np.float32), np.asarray(target, np.float32)
    return float(np.max(np.abs(o - t) / (atol + rtol * np.abs(t)))) if t.size else 0.0


def expected(wl: workloads.Workload, config: dict, seed: int) -> Expected:
    """The inputs, reference and tolerance for ``seed`` (cached per worker).

    Workloads with ``float32_check`` run in a low-precision dtype are compared with the
    reference computed in float32 on the same inputs. Where the low-precision reference
    itself deviates from that by more than half the tolerance, atol and rtol are widened
    by the same factor until it is within half: a kernel as accurate as the XLA baseline
    passes, and rounding differently from it is not an error.
    """
    import jax
    import jax.numpy as jnp

    key = (wl.name, repr(sorted(config.items())), seed)
    if key not in _inputs_cache:
        inputs = wl.make_inputs(config, seed)
        ref = jax.block_until_ready(_jitted_reference(wl, config)(*inputs))
        atol, rtol = wl.tolerance(config)
        target = ref
        if wl.float32_check and config.get("dtype", "float32") != "float32":
            upcast = [a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in inputs]
            target = jax.block_until_ready(_jitted_reference(wl, {**config, "dtype": "float32"})(*upcast))
            noise = max(_tolerance_used(r, t, atol, rtol)
                        for r, t in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(target)))
            widen = max(1.0, NOISE_MARGIN * noise)
            atol, rtol = atol * widen, rtol * widen
        if len(_inputs_cache) >= 12:  # a worker serves one workload at a time; bound memory anyway
            _inputs_cache.clear()
        _inputs_cache[key] = Expected(inputs, ref, target, atol, rtol)
    return _inputs_cache[key]


def check(module, wl: workloads.Workload, on_tpu: bool) -> float:
    """Correctness over N_SEEDS fresh inputs; returns the max abs error seen."""
    import jax

    config = wl.config if on_tpu else wl.check_config()
    module.CONFIG = dict(config)
    fn = jax.jit(module.workload)
    worst = 0.0
    for seed in range(N_SEEDS):
        case = expected(wl, config, seed)
        try:
            if on_tpu:
                out = jax.block_until_ready(fn(*case.inputs))
            else:
                from jax.experimental.pallas import tpu as pltpu

                with pltpu.force_tpu_interpret_mode():
                    out = jax.block_until_ready(fn(*case.inputs))
        except Exception as e:  # noqa: BLE001
            raise StageError(f"calling workload failed (seed {seed}): {_short(e)}\n{_candidate_frames(e)}") from None
        check_structure(out, case.ref)
        worst = max(worst, compare_outputs(out, case.target, case.atol, case.rtol))
    return worst


def _guard_vmem(jaxpr) -> None:
    """Reject kernels that cannot fit the chip's VMEM before compiling them.

    The compiler can spend minutes before it reports such an OOM (a 292 MiB kernel took
    270 s). The estimate ignores layout padding, so it is a lower bound: what it rejects
    certainly fails; the compiler judges the rest, against its own accounting.
    """
    for eqn in pallas_call_eqns(jaxpr):
        need = vmem_estimate(eqn)
        if need > V6E.vmem_bytes:
            raise StageError(
                f"VMEM exhausted: a pallas_call's blocks and scratch need at least {need / 2**20:.1f} MiB, "
                f"over the v6e's {V6E.vmem_bytes / 2**20:.0f} MiB of VMEM (rejected before compiling; "
                f"its scoped limit is {vmem_limit(eqn, V6E.scoped_vmem_bytes) / 2**20:.0f} MiB)"
            )


def _compile_error(exc: BaseException) -> str:
    text = str(exc)
    if "vmem" in text.lower() and ("RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "VmemOom" in text):
        first = next((ln for ln in text.splitlines() if "vmem" in ln.lower()), text[:300])
        return f"VMEM exhausted (v6e compiler): {first.strip()}"
    return f"v6e compile failed: {_short(exc)}"


def compile_full(module, wl: workloads.Workload):
    """AOT-compile the candidate for v6e at full size; returns (closed jaxpr, compiled, bundle profiles)."""
    import jax

    specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
    try:
        traced_only = jax.jit(module.workload).trace(*specs)
    except Exception as e:  # noqa: BLE001
        raise StageError(f"tracing workload at full size failed: {_short(e)}\n{_candidate_frames(e)}") from None
    _guard_vmem(traced_only.jaxpr.jaxpr)
    bundles.collect()  # drop what a failed compile may have left
    try:
        traced, compiled = compile_for_v6e(module.workload, specs)
    except Exception as e:  # noqa: BLE001
        raise StageError(_compile_error(e)) from None
    return traced.jaxpr, compiled, bundles.collect()


def _prefetch(closed_jaxpr, wl: workloads.Workload) -> dict:
    """Concrete scalar-prefetch operands on the seed-0 full-size inputs, for kernels that
    have them: their grids and index maps depend on the data (page tables, group sizes)."""
    from jaxbench_env.sim.pallas import prefetch_operands

    try:
        return prefetch_operands(closed_jaxpr, lambda: wl.make_inputs(wl.config, 0))
    except Exception:  # noqa: BLE001 - the model falls back to upper bounds, and says so
        return {}


def measure_on_tpu(fn, inputs, warmup: int = 5, iters: int = 50) -> float:
    """Median wall-clock seconds of one call on the TPU, after warm-up."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*inputs))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


COMPILE_ONLY_NOTE = ("compile-checked only: jax's TPU interpreter cannot run this shipped kernel on a CPU; "
                     "its correctness is checked natively on a TPU")


def evaluate(request: Mapping[str, Any]) -> dict:
    """Run one candidate (``request["source"]``) or the XLA reference (``source`` None).

    ``request["compile_only"]`` skips the correctness check (``correct`` is then None); the
    evaluator sets it for a workload's own expert file where jax cannot interpret it, and
    for timing-only requests (``unchecked_because`` says so).
    """
    wl = workloads.get(request["workload"], request.get("config"))
    backend = request["backend"]
    result = {"compiled": False, "correct": False, "max_abs_err": None, "time_ms": None,
              "error": None, "stage": "load", "details": {}}
    timings = result["details"].setdefault("stage_s", {})
    try:
        t0 = time.perf_counter()
        if request.get("source") is None:
            module = types.SimpleNamespace(workload=lambda *a: wl.reference(wl.config, *a))
        else:
            module = load_module(request["source"], wl.config, request.get("schedule") or {})
        result["stage"] = "compile"
        on_tpu = backend == "tpu"
        if not on_tpu:
            jaxpr, compiled, profiles = compile_full(module, wl)
        result["compiled"] = True
        timings["compile"] = time.perf_counter() - t0

        if request.get("source") is None:
            result["correct"] = True
        elif request.get("compile_only"):
            result["correct"] = None  # not checked, and every report says so
            result["details"]["check"] = request.get("unchecked_because") or COMPILE_ONLY_NOTE
        else:
            result["stage"] = "check"
            t1 = time.perf_counter()
            result["max_abs_err"] = check(module, wl, on_tpu)
            timings["check"] = time.perf_counter() - t1
            result["correct"] = True

        result["stage"] = "time"
        t2 = time.perf_counter()
        if on_tpu:
            import jax

            inputs = wl.make_inputs(wl.config, 0)
            seconds = measure_on_tpu(jax.jit(module.workload), inputs)
            result["details"]["device_kind"] = jax.devices()[0].device_kind
        else:
            breakdown = predict_program(jaxpr.jaxpr, compiled, V6E, profiles, _prefetch(jaxpr, wl))
            seconds = breakdown.time_s
            result["details"]["sim"] = breakdown.to_dict()
        timings["time"] = time.perf_counter() - t2
        result["time_ms"] = seconds * 1e3
        result["stage"] = "done"
    except _Mismatch as e:
        result["max_abs_err"] = e.max_abs_err
        result["error"] = str(e)
    except StageError as e:
        result["error"] = str(e)
    except BaseException as e:  # noqa: BLE001 - a worker must answer, whatever the candidate did
        result["error"] = f"{result['stage']} stage failed: {_short(e)}"
    return result
