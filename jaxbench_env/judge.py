"""The judge's side of the trust boundary: verify, check, compile and price artifacts.

Runs in the evaluator's worker process (``worker.py``), which never executes candidate
Python. What it receives from the candidate's process is data: three serialized programs
(``candidate_process.py``) and the index of the check size they were traced at. For each
candidate it

1. reads the programs and checks their signatures against its own input specs at full
   size and at the claimed rung of the check-size ladder (``Workload.check_rungs``);
2. verifies they are one program (``programs.verify_artifacts``): allowed ops only, the
   CPU and TPU check-size programs the same outside the kernels, the check-size and
   full-size TPU programs the same up to sizes;
3. runs the CPU program on inputs it draws itself, with seeds drawn in this process
   (the candidate's process never sees the inputs), and compares with its own reference;
4. compiles the full-size TPU program for v6e, verifies that its kernels write every
   element of their outputs, and prices what it compiled (or measures it on a TPU).

Each stage turns a failure into a readable message in the result; nothing raises.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

import workloads
from jaxbench_env.candidate_process import short

N_SEEDS = 3
ARTIFACTS = ("full_tpu", "check_tpu", "check_cpu")
# Drawn once per judge process: the candidate's process never learns them, nor sees inputs.
SECRET_SEEDS = tuple(1000 + int.from_bytes(os.urandom(4), "little") % 2**30 for _ in range(N_SEEDS))
SPEC_SEED = 0  # the spec's own inputs (JAXBench's): a time is priced on them, at full size
COMPILE_ONLY_NOTE = ("compile-checked only: jax's interpreter cannot run this shipped kernel on a CPU; "
                     "its correctness is checked natively on a TPU")

_expected_cache: dict = {}  # (workload, config, seed) -> Expected
_reference_fns: dict = {}  # (workload, config) -> the jitted reference
_essential_cache: dict = {}  # (workload, config) -> (bytes, flops)


class Rejected(Exception):
    """The candidate failed a stage; the message is what the user sees."""


class SizeBoundary(Rejected):
    """The programs differ in a way a size boundary explains (structure that switches
    with a dimension, a grid axis with one step at the check size): check at the next
    rung of the ladder instead of rejecting."""


class Mismatch(Rejected):
    def __init__(self, max_abs_err: float, msg: str):
        super().__init__(msg)
        self.max_abs_err = max_abs_err


# --- the reference and the comparison -------------------------------------------------

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
    """The inputs, reference and tolerance for ``seed`` (cached per process).

    Workloads with ``float32_check`` run in a low-precision dtype are compared with the
    reference computed in float32 on the same inputs. Where the low-precision reference
    itself deviates from that by more than half the tolerance, atol and rtol are widened
    by the same factor until it is within half: a kernel as accurate as the XLA baseline
    passes, and rounding differently from it is not an error.
    """
    import jax
    import jax.numpy as jnp

    key = (wl.name, repr(sorted(config.items())), seed)
    if key not in _expected_cache:
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
        if len(_expected_cache) >= 12:  # a worker serves one workload at a time; bound memory anyway
            _expected_cache.clear()
        _expected_cache[key] = Expected(inputs, ref, target, atol, rtol)
    return _expected_cache[key]


def dtype_accepted(got, want) -> bool:
    """An output dtype the check accepts for the reference's: the same, or a wider float (a
    kernel may keep its f32 accumulator's precision; its values are still checked, and the
    bigger output is timed)."""
    import jax.numpy as jnp  # its dtypes know bfloat16 as a float

    got, want = jnp.dtype(got), jnp.dtype(want)
    return got == want or (jnp.issubdtype(got, jnp.floating) and jnp.issubdtype(want, jnp.floating)
                           and got.itemsize > want.itemsize)


def check_structure(out, ref) -> None:
    import jax

    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if out_tree != ref_tree:
        raise Rejected(f"output structure {out_tree} does not match the reference's {ref_tree}")
    for o, r in zip(out_leaves, ref_leaves):
        if tuple(np.shape(o)) != tuple(np.shape(r)):
            raise Rejected(f"output shape {tuple(np.shape(o))} does not match the reference's {tuple(np.shape(r))}")
        if not dtype_accepted(o.dtype, r.dtype):
            raise Rejected(f"output dtype {np.dtype(o.dtype)} does not match the reference's {np.dtype(r.dtype)}")


def compare_outputs(out, ref, atol: float, rtol: float) -> float:
    """Max abs error; raises Rejected when not allclose or not finite."""
    import jax

    worst = 0.0
    for o, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        o32 = np.asarray(o, dtype=np.float32)
        r32 = np.asarray(r, dtype=np.float32)
        if not np.all(np.isfinite(o32)):
            raise Rejected(f"output has {int(np.sum(~np.isfinite(o32)))} NaN/Inf values")
        err = np.abs(o32 - r32)
        worst = max(worst, float(err.max()) if err.size else 0.0)
        bad = ~(err <= atol + rtol * np.abs(r32))
        if bad.any():
            raise Mismatch(worst, f"wrong result: {int(bad.sum())} of {bad.size} values outside atol={atol}, "
                                  f"rtol={rtol}; max abs error {worst:.4g}")
    return worst


# --- reading and checking artifacts ------------------------------------------------------

def read_artifacts(blobs: Mapping[str, bytes]) -> dict:
    """Deserialize the candidate's programs; a malformed blob is a rejection."""
    from jax import export

    out = {}
    for name in ARTIFACTS:
        if name not in blobs:
            continue
        try:
            out[name] = export.deserialize(bytearray(blobs[name]))
        except Exception as e:  # noqa: BLE001 - bytes from an untrusted process
            raise Rejected(f"the {name} program could not be read: {short(e)}") from None
    return out


def _avals(values) -> list[tuple]:
    return [(tuple(int(d) for d in v.shape), str(np.dtype(v.dtype))) for v in values]


def check_signature(wl: workloads.Workload, exported, config: dict, what: str) -> None:
    """The program takes the workload's inputs at ``config`` and returns the reference's
    output structure, shapes and dtypes."""
    import jax

    specs = jax.eval_shape(lambda: wl.make_inputs(config, 0))
    if _avals(exported.in_avals) != _avals(specs):
        raise Rejected(f"the {what} program takes {_avals(exported.in_avals)}, not the workload's inputs "
                       f"{_avals(specs)}")
    ref = jax.eval_shape(lambda *a: wl.reference(config, *a), *specs)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if exported.out_tree != ref_tree:
        raise Rejected(f"output structure {exported.out_tree} does not match the reference's {ref_tree}")
    for got, want in zip(_avals(exported.out_avals), _avals(ref_leaves)):
        if got[0] != want[0]:
            raise Rejected(f"output shape {got[0]} does not match the reference's {want[0]}")
        if not dtype_accepted(got[1], want[1]):
            raise Rejected(f"output dtype {got[1]} does not match the reference's {want[1]}")


def check_outputs(wl: workloads.Workload, exported_cpu, config: dict, seeds=SECRET_SEEDS) -> float:
    """Run the interpret-mode program on the judge's inputs; the max abs error over ``seeds``."""
    import jax

    fn = jax.jit(exported_cpu.call)
    worst = 0.0
    for seed in seeds:
        case = expected(wl, config, seed)
        try:
            out = jax.block_until_ready(fn(*case.inputs))
        except Exception as e:  # noqa: BLE001
            raise Rejected(f"running the check-size program failed: {short(e)}") from None
        check_structure(out, case.ref)
        worst = max(worst, compare_outputs(out, case.target, case.atol, case.rtol))
    return worst


# --- compiling and pricing -----------------------------------------------------------------

def compile_error(exc: BaseException) -> str:
    text = str(exc)
    if "vmem" in text.lower() and ("RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "VmemOom" in text):
        first = next((ln for ln in text.splitlines() if "vmem" in ln.lower()), text[:300])
        return f"VMEM exhausted (v6e compiler): {first.strip()}"
    return f"v6e compile failed: {short(exc)}"


def guard_vmem(exported) -> None:
    """Reject kernels that cannot fit the chip's VMEM before compiling them.

    The compiler can spend minutes before it reports such an OOM (a 292 MiB kernel took
    270 s). The estimate ignores layout padding, so it is a lower bound: what it rejects
    certainly fails; the compiler judges the rest, against its own accounting.
    """
    from jaxbench_env.sim import V6E, mosaic

    for call in mosaic.stablehlo_custom_calls(exported.mlir_module()):
        need = mosaic.parse_kernel(call).vmem_bytes
        if need > V6E.vmem_bytes:
            raise Rejected(f"VMEM exhausted: a pallas_call's blocks and scratch need at least {need / 2**20:.1f} MiB, "
                           f"over the v6e's {V6E.vmem_bytes / 2**20:.0f} MiB of VMEM (rejected before compiling)")


def compile_v6e(fn, specs):
    """AOT-compile ``fn`` for v6e; returns (compiled, bundle profiles)."""
    from jaxbench_env.aot import compile_for_v6e
    from jaxbench_env.sim import bundles

    bundles.collect()  # drop what a failed compile may have left
    try:
        _, compiled = compile_for_v6e(fn, specs)
    except Exception as e:  # noqa: BLE001
        raise Rejected(compile_error(e)) from None
    return compiled, bundles.collect()


def check_coverage(exported, prefetch) -> list[str]:
    """Reject a full-size program whose kernels leave output elements unwritten (grids
    sized for the check, not the full size); returns what could not be verified."""
    from jaxbench_env.sim import mosaic

    unverified = []
    for call, tables in zip(mosaic.stablehlo_custom_calls(exported.mlir_module()), prefetch):
        coverage = mosaic.output_coverage(call, tables)
        if coverage:
            raise Rejected("the full-size program does not compute its whole output: " + "; ".join(coverage))
        unverified.extend(coverage.unverified)
    return unverified


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


# Told each stage's name as it starts (the worker streams them to the evaluator's progress display).
on_stage: Callable[[str], None] | None = None


def _timed(result: dict, stage: str, fn, *args):
    """Run one stage, recording its name (for errors) and wall time."""
    result["stage"] = stage
    if on_stage is not None:
        on_stage(stage)
    t0 = time.perf_counter()
    out = fn(*args)
    result["details"]["stage_s"][stage] = result["details"]["stage_s"].get(stage, 0.0) + time.perf_counter() - t0
    return out


def _empty_result() -> dict:
    return {"compiled": False, "correct": False, "max_abs_err": None, "time_ms": None,
            "error": None, "stage": "load", "details": {"stage_s": {}}}


def _run(result: dict, body) -> dict:
    """``body(result)`` with every failure turned into the result's error."""
    try:
        body(result)
        result["stage"] = "done"
    except Mismatch as e:
        result["max_abs_err"] = e.max_abs_err
        result["error"] = str(e)
    except Rejected as e:
        result["error"] = str(e)
        if isinstance(e, SizeBoundary):
            result["details"]["size_boundary"] = True  # the evaluator may climb a rung
    except BaseException as e:  # noqa: BLE001 - a judge must answer, whatever it was given
        result["error"] = f"{result['stage']} stage failed: {short(e)}"
    return result


def essential_work(wl) -> tuple[float, float]:
    """The workload's essential (bytes, FLOPs) at full size, traced once per judge process."""
    key = (wl.name, repr(sorted(wl.config.items())))
    if key not in _essential_cache:
        _essential_cache[key] = wl.essential_work(wl.config)
    return _essential_cache[key]


def _bounds(breakdown) -> list[str]:
    """The bounds, rather than the model, that set part of a prediction."""
    kernels = breakdown.features.kernels
    found = []
    if breakdown.features.conditionals:
        found.append("upper bound: every branch of a conditional")
    if any(k.grid_bound is not None for k in kernels):
        found.append("upper bound: a grid sized at run time")
    if any(k.dynamic_index for k in kernels):
        found.append("upper bound: index maps not evaluable (a fresh block every step)")
    found.extend(f"upper bound: {note}" for k in kernels for note in k.notes)
    return found


def full_size_tables(wl, full) -> list:
    """The concrete leading operands (grid bounds, scalar-prefetch tables) of each kernel of
    the full-size program, on the spec's inputs (``prefetch.prefetch_tables``)."""
    from jaxbench_env.sim.prefetch import prefetch_tables

    return prefetch_tables(full, lambda: wl.make_inputs(wl.config, SPEC_SEED))


def check_seeds(full) -> tuple:
    """The seeds of the check of the full-size program ``full``: the secret ones and, where a
    kernel's work is set by values computed from the inputs (scalar-prefetch operands, a grid
    sized at run time), the spec's own too. Its time is priced on the spec's inputs, which are
    public, so a kernel could recognise them (equal group sizes, say) and do less on them
    alone; checked on inputs of their structure, it does there what it does where priced."""
    from jaxbench_env.sim import mosaic
    from jaxbench_env.sim.prefetch import leading_operand_count

    if any(leading_operand_count(c) for c in mosaic.stablehlo_custom_calls(full.mlir_module())):
        return SECRET_SEEDS + (SPEC_SEED,)
    return SECRET_SEEDS


def unseen_control(wl, full, tables: list, check, check_config: dict, aligned: dict, seeds=SECRET_SEEDS,
                   inputs_of=None) -> list:
    """Per kernel of the full-size program (its exported order), what it does there that the
    check-size program ``check`` never did on the check's inputs (``mosaic.Unseen``): loops,
    branch sides and decisions (comparisons, selects, mins and maxes of its body and index
    maps: ``mosaic.unseen_items``; the check's patterns are the union over ``seeds``), and
    inputs read whole in the check but not at full size. Each loop, arm and decision is
    compared with the one the program comparison aligned it with (``aligned``, from
    ``programs.verify_artifacts``); one without a counterpart saw nothing. Where ``seeds``
    hold the spec's (``check_seeds``), the loops and arms set by values a kernel loads are
    also compared with what they did on the spec's inputs alone: the full-size run is on the
    spec's inputs, and what the other seeds' inputs make them do is no sign of what these do.
    ``inputs_of(seed)``: the check's inputs (default: drawn again)."""
    from jaxbench_env.sim import mosaic
    from jaxbench_env.sim.prefetch import leading_operand_count, prefetch_tables_each

    small = mosaic.stablehlo_custom_calls(check.mlir_module())
    seen: list[dict] = [{} for _ in small]
    spec: list[dict] | None = None  # the patterns on the spec's inputs alone, where the check ran them
    whole: list[set] = [set() for _ in small]  # inputs some check read in full
    table_sets = [[[] for _ in small]]  # no tables: the same patterns on every input
    if any(leading_operand_count(c) for c in small):
        draw = inputs_of or (lambda seed: wl.make_inputs(check_config, seed))
        table_sets = prefetch_tables_each(check, [draw(seed) for seed in seeds])  # concrete: not all traceable
        if SPEC_SEED in seeds:
            spec = [{} for _ in small]

    def evaluated(call, t) -> tuple[dict, dict]:
        """(patterns of the body and index maps, the fraction of each input read). Not
        evaluable: at the check size nothing counts as seen; at full size, pricing says why."""
        try:
            body = mosaic.control_patterns(call, t)
        except mosaic.EVALUATION_ERRORS:  # Unpriceable is a ValueError
            body = {}
        try:
            maps, read = mosaic.window_patterns(call, t)
        except mosaic.EVALUATION_ERRORS:
            maps, read = {}, {}
        return {**body, **maps}, read

    for seed, small_tables in zip(seeds, table_sets):
        for j, call in enumerate(small):
            patterns, read = evaluated(call, small_tables[j])
            for item, did in patterns.items():
                seen[j].setdefault(item, set()).update(did)
                if spec is not None and seed == SPEC_SEED:
                    spec[j][item] = set(did)
            whole[j].update(i for i, f in read.items() if f >= 1.0)
    unseen = []
    for j, (call, t) in enumerate(zip(mosaic.stablehlo_custom_calls(full.mlir_module()), tables)):
        patterns, read = evaluated(call, t)
        partial = {i for i, f in read.items() if f < 1.0}
        check, on_spec = _keyed_at_full_size(small[j], call, aligned, seen[j], spec[j] if spec is not None else {})
        found = mosaic.unseen_items(check, patterns)
        if spec is not None:
            data = mosaic.data_items(call)
            found |= mosaic.unseen_items(on_spec, {k: did for k, did in patterns.items() if k in data})
        unseen.append(mosaic.as_unseen(call, found, frozenset(partial & whole[j])))
    return unseen


def _keyed_at_full_size(check_call, full_call, aligned: dict, *patterns: dict) -> list[dict]:
    """Each of a check-size kernel's ``patterns`` under the keys of the full-size kernel's
    loops, arms and decisions they were aligned with (``mosaic.pattern_sites``): keys are
    numbered in body order, and a Python loop unrolled more times at full size numbers
    everything after it differently (an extra iteration's ops stand for the last iteration
    both sizes have)."""
    from jaxbench_env.programs import kernel_key
    from jaxbench_env.sim import mosaic

    ops = aligned.get((kernel_key(check_call.body), kernel_key(full_call.body)), {})
    sites = mosaic.pattern_sites(mosaic.parse_kernel(check_call))
    at_check = {site: key for key, site in sites.items()}
    counterpart = {key: at_check.get((fn, ops.get((fn, index)), part))
                   for key, (fn, index, part) in mosaic.pattern_sites(mosaic.parse_kernel(full_call)).items()}
    out = []
    for seen in patterns:
        keyed = {key: did for key, did in seen.items() if key not in sites}  # no op's (block moves, grid axes)
        keyed.update((key, seen[c]) for key, c in counterpart.items() if c in seen)
        out.append(keyed)
    return out


def describe_unseen(full, unseen: list) -> str:
    """The first kernel's ``unseen_control`` finding, in words (a reason to climb a rung)."""
    from jaxbench_env.sim import mosaic

    for n, (call, found) in enumerate(zip(mosaic.stablehlo_custom_calls(full.mlir_module()), unseen)):
        places = sorted({"its body" if k[0] == "decision" else f"the index map of window {k[1]}"
                         for k in found.decisions if k[0] != "moves"})
        moves = sorted((k[1], k[2]) for k in found.decisions if k[0] == "moves")
        decided = (f"kernel {n} decides at full size a way it never did at the check size (a comparison, select, "
                   f"min or max in {places[0] if places else ''} takes a side there that no check-size step took: "
                   "a bound or an index that binds only at full size)")
        if "its body" in places:  # the loops and arms found depend on it
            return decided
        if found.items:
            body = mosaic.parse_kernel(call).body
            labels = sorted({body.items[i].label.split(" (")[0] for i in found.items})
            return (f"kernel {n}'s {', '.join(labels)} at full size do what they never did at the check size "
                    "(a branch side never taken or always taken, a loop never skipped, whose trip count never "
                    "varied or never went so low)")
        if found.grid:
            return (f"kernel {n}'s grid axis {min(found.grid)}, sized at run time, runs fewer steps at full size than "
                    "at the check size")
        if found.short:
            return (f"kernel {n} reads all of its input {min(found.short)} at the check size but not at full size "
                    "(an index map that stops short of the array there)")
        if places:
            return decided
        if moves:
            return (f"kernel {n}'s window {moves[0][0]} keeps its block at full size where grid axis {moves[0][1]} "
                    "advances, where at the check size it always moved on (or moves where it always stayed): blocks "
                    "reused or fetched in a way the check never verified")
    return ""


def unbounded_unseen(full, unseen: list) -> str | None:
    """The first loop that does at full size what no check saw (``unseen_control``) and whose
    trip count comes from values its kernel loads, in words; None if there is none. Such a
    loop has no bound to price it at: its largest trip count is the one on the inputs the time
    is priced on, the spec's own (seed 0, public), and a kernel that recognises them by their
    values could run no trips on them alone."""
    from jaxbench_env.sim import mosaic

    for n, (call, found) in enumerate(zip(mosaic.stablehlo_custom_calls(full.mlir_module()), unseen)):
        if found.grid:
            return (f"kernel {n}'s grid axis {min(found.grid)}, sized at run time from the inputs, runs fewer steps at "
                    "full size than at any check size: nothing the judge controls bounds it on the inputs the time "
                    "is priced on, so it is not priced")
        loops = found.items & mosaic.data_loops(call) if found.items else set()
        if loops:
            label = mosaic.parse_kernel(call).body.items[min(loops)].label.split(" (")[0]
            return (f"kernel {n}'s {label} does at full size what it never did at any check size, and its trip "
                    "count comes from values the kernel loads (computed from the inputs): nothing the judge "
                    "controls bounds it on the inputs the time is priced on, so it is not priced")
    return None


def _simulate(wl, compiled, profiles, exported=None, tables=None, unseen=None) -> tuple[float, dict]:
    """The simulator's predicted seconds and its breakdown (``details.sim``) of a compiled
    program; ``exported`` (a candidate's full-size program) supplies the kernels'
    scalar-prefetch tables (``tables``, if already evaluated: ``full_size_tables``).
    ``unseen``: per kernel of ``exported``, what no check saw (``unseen_control``), priced at
    a bound. No prediction is below the workload's physical floor: one under it is raised
    to it, and says so."""
    from jaxbench_env.sim import V6E, mosaic, predict_program

    prefetch = by_call = None
    if exported is not None:
        if tables is None:
            tables = full_size_tables(wl, exported)
        unverified = check_coverage(exported, tables)
        # The compiled program may order kernels differently, or add Mosaic kernels of its own.
        order = mosaic.match_calls(mosaic.hlo_custom_calls(compiled.as_text()),
                                   mosaic.stablehlo_custom_calls(exported.mlir_module()))
        prefetch = [tables[j] if j is not None else None for j in order]
        if unseen is not None:
            by_call = [unseen[j] if j is not None else None for j in order]
    try:
        breakdown = predict_program(compiled, V6E, profiles, prefetch, by_call)
    except mosaic.Unpriceable as e:  # work the simulator cannot bound: no price, no reward
        raise Rejected(f"the simulator cannot price this program: {e}") from None
    unknown = breakdown.features.unknown_trips
    if exported is not None and unknown:  # a candidate's: priced once, it could hide any work
        raise Rejected("a loop outside the kernels whose trip count the compiler cannot determine (its bound is "
                       "computed from data) cannot be priced: give it static bounds, or move it into a kernel "
                       f"(while loop {unknown[0]})")
    if exported is not None and unverified:
        breakdown.notes.append("output coverage not verified: " + "; ".join(unverified))
    nbytes, flops = essential_work(wl)
    floor_s = V6E.floor_s(nbytes, flops)
    seconds = max(breakdown.time_s, floor_s)
    details = {**breakdown.to_dict(), "time_s": seconds}
    details["caveats"] = details.pop("notes")  # every assumption the price rests on
    details["floor"] = {"time_s": floor_s, "essential_bytes": nbytes, "essential_flops": flops,
                        "model_time_s": breakdown.time_s, "applied": breakdown.time_s < floor_s}
    details["bounds"] = _bounds(breakdown)
    if breakdown.time_s < floor_s:
        details["bounds"].append("physical floor")
        details["caveats"].append(
            f"the model's {breakdown.time_s * 1e3:.3f} ms is under the physical floor, {floor_s * 1e3:.3f} ms "
            f"(the workload's essential {nbytes / 1e9:.3g} GB at peak HBM bandwidth or {flops / 1e12:.3g} TFLOP "
            "at the peak MXU rate): the time is the floor, not the model's")
    return seconds, details


def _time(result: dict, wl, fn, specs, backend: str, exported=None) -> None:
    """Compile (sim) and fill ``time_ms``: simulated on "sim", measured on "tpu"."""
    import jax

    if backend == "tpu":
        result["compiled"] = True  # it ran on the chip
        seconds = _timed(result, "time", measure_on_tpu, jax.jit(fn), wl.make_inputs(wl.config, SPEC_SEED))
        result["details"]["device_kind"] = jax.devices()[0].device_kind
    else:
        compiled, profiles = _timed(result, "compile", compile_v6e, fn, specs)
        result["compiled"] = True
        try:
            seconds, result["details"]["sim"] = _timed(result, "time", _simulate, wl, compiled, profiles, exported)
        except Rejected:
            result["correct"] = False  # coverage: the program does not compute its output
            raise
    result["time_ms"] = seconds * 1e3


# --- the two requests -----------------------------------------------------------------------

def baseline(request: Mapping[str, Any]) -> dict:
    """The XLA reference's compile and time: the judge's own code, no candidate involved."""
    import jax

    wl = workloads.get(request["workload"], request.get("config"))

    def body(result):
        result["correct"] = True
        specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
        _time(result, wl, lambda *a: wl.reference(wl.config, *a), specs, request["backend"])

    return _run(_empty_result(), body)


def verify_request(wl, request) -> tuple[dict, dict, list[str], dict | None]:
    """The candidate's programs, read and verified; the check config of its rung; the
    caveats of a check at that rung; and how the ops of the check-size and full-size
    programs' kernels correspond (``verify_artifacts``), None where they are not one program
    (only a trusted expert's)."""
    rungs = wl.check_rungs()
    rung = request.get("rung")
    if not isinstance(rung, int) or isinstance(rung, bool) or not 0 <= rung < len(rungs):
        raise Rejected(f"no check size numbered {rung!r} (this workload has {len(rungs)})")
    check_config = rungs[rung]
    programs = read_artifacts(request["artifacts"])
    for name, config, label in (("full_tpu", wl.config, "full-size TPU"), ("check_tpu", check_config, "check-size TPU"),
                                ("check_cpu", check_config, "check-size CPU")):
        if name in programs:
            check_signature(wl, programs[name], config, label)
        elif name != "check_cpu":
            raise Rejected(f"the {label} program is missing")
    guard_vmem(programs["full_tpu"])  # over VMEM at full size fails whatever the check size
    from jaxbench_env.programs import ProgramMismatch, verify_artifacts

    caveats, aligned = [], None
    try:
        aligned = verify_artifacts(programs["full_tpu"], programs["check_tpu"], programs.get("check_cpu"), wl.config,
                                   check_config)
    except ProgramMismatch as e:
        if not request.get("trusted_expert"):
            raise SizeBoundary(str(e)) from None
        # The workload's own expert file, byte for byte (the evaluator vouches): nothing of it
        # runs at the check size, so the check-size program need not be the full-size one.
        caveats.append(f"the expert's check-size program differs from its full-size one: {str(e).splitlines()[0]}")
    if not request.get("compile_only"):
        single = single_step_axes(programs["check_tpu"], programs["full_tpu"])
        if single and rung + 1 < len(rungs):
            raise SizeBoundary(single)  # a check that proves too little: climb
        if single:
            caveats.append(f"{single} at the largest affordable check size: what happens between its "
                           "steps is not checked")
    return programs, check_config, caveats, aligned


def single_step_axes(check, full) -> str | None:
    """A grid axis with one step at the check size and several at full size hides what
    happens between steps (a kernel that skips all but the last k-step computes the same
    there), and one with no step at all (a block larger than a shrunk dimension, floor-divided)
    computes nothing: the first such axis, described, or None."""
    from jaxbench_env.sim import mosaic

    pairs = zip(mosaic.stablehlo_custom_calls(check.mlir_module()), mosaic.stablehlo_custom_calls(full.mlir_module()))
    for n, (c, f) in enumerate(pairs):
        small, big = mosaic.parse_kernel(c).iteration_bounds, mosaic.parse_kernel(f).iteration_bounds
        for axis, (a, b) in enumerate(zip(small, big)):
            if a in (0, 1) and (b is None or b > a):
                return (f"kernel {n}'s grid axis {axis} has {'one step' if a else 'no step'} at the check size and "
                        f"{'a run-time number' if b is None else b} at full size")
    return None


def judge(request: Mapping[str, Any]) -> dict:
    """Judge one candidate's artifacts (``request["artifacts"]``, bytes by name) traced at
    check rung ``request["rung"]``. ``compile_only`` skips the output check (``correct`` is
    then None, and ``unchecked_because`` says why)."""
    wl = workloads.get(request["workload"], request.get("config"))
    backend = request["backend"]

    def body(result):
        result["details"]["check_rung"] = request.get("rung")
        programs, check_config, caveats, aligned = _timed(result, "verify", verify_request, wl, request)
        if caveats:
            result["details"]["check_caveats"] = caveats
        result["details"]["check_size"] = wl.shrunk(check_config)  # what the check shrank
        full = programs["full_tpu"]
        seeds = check_seeds(full)
        tables = unseen = None
        if backend == "sim":  # compile first: the commonest failure, and cheaper than the check
            compiled, profiles = _timed(result, "compile", compile_v6e, full.call, full.in_avals)
            result["compiled"] = True
            tables = _timed(result, "time", full_size_tables, wl, full)
            # What the check did not see is priced at a bound. Timing-only runs check nothing: they
            # price the template's schedules as checked runs do at a rung that sees it all.
            if aligned is not None and not request.get("own_expert") and not request.get("compile_only"):
                unseen = _timed(result, "verify", unseen_control, wl, full, tables, programs["check_tpu"],
                                check_config, aligned, seeds, lambda seed: expected(wl, check_config, seed).inputs)
                if any(unseen) and request["rung"] + 1 < len(wl.check_rungs()):
                    raise SizeBoundary(describe_unseen(full, unseen))  # a check that saw too little: climb
                unbounded = unbounded_unseen(full, unseen) if any(unseen) else None
                if unbounded:
                    raise Rejected(unbounded)
        if request.get("compile_only"):
            result["correct"] = None  # not checked, and every report says so
            result["details"]["check"] = request.get("unchecked_because") or COMPILE_ONLY_NOTE
        elif backend == "tpu":  # natively, at full size
            # The timed run's own inputs too: on a chip, work skipped on them alone (a branch in
            # the glue, say) would be measured.
            result["max_abs_err"] = _timed(result, "check", check_outputs, wl, full, wl.config,
                                           SECRET_SEEDS + (SPEC_SEED,))
            result["correct"] = True
        else:
            if "check_cpu" not in programs:
                raise Rejected("the check-size program could not be built for jax's interpreter: "
                               + str(request.get("interpret_error") or "no reason given"))
            result["max_abs_err"] = _timed(result, "check", check_outputs, wl, programs["check_cpu"], check_config,
                                           seeds)
            result["correct"] = True
        if backend == "tpu":
            _time(result, wl, full.call, full.in_avals, backend)
        else:
            try:
                seconds, result["details"]["sim"] = _timed(result, "time", _simulate, wl, compiled, profiles, full,
                                                            tables, unseen)
            except Rejected:
                result["correct"] = False
                raise
            result["time_ms"] = seconds * 1e3

    return _run(_empty_result(), body)
