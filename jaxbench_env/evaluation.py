"""Evaluating candidates: results, the cache in front, the candidate's sandbox and the judge behind.

``Evaluator`` is the one entry point the environment, the CLI and the policies use. It
owns a workload bound to a config, a backend ("sim" or "tpu"), the on-disk result cache,
and two processes on either side of the trust boundary:

- a ``Sandbox`` runs each candidate's Python in a fresh, isolated process that only
  traces and exports its programs (``candidate_process.py``);
- the judge's ``Worker`` verifies, checks, compiles and prices those programs
  (``judge.py``) and never executes candidate code.

Only the judge's answers enter the cache. The XLA baseline is judged once per (workload,
config, backend), before any candidate of it runs, and cached like any result.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import workloads
from jaxbench_env import sim
from jaxbench_env.cache import ResultCache
from jaxbench_env.candidate import Candidate, content_key
from jaxbench_env.sandbox import Sandbox
from jaxbench_env.worker import DEFAULT_MEMORY_BYTES, DEFAULT_TIMEOUT_S, Worker, WorkerError

BACKENDS = ("auto", "sim", "tpu")
TIMING_SOURCE = {"sim": "v6e-sim", "tpu": "v6e-measured"}
# 2: correct may be None (compile-only experts); 3: sim features; 4: judged artifacts; 5: the physical floor;
# 6: wider float outputs accepted, a grid axis without a step at the check size climbs the ladder;
# 7: references made JAXBench's programs op for op, JAXBench's signatures adapted. Code changes
# need no bump: the key holds a digest of the code (``code_digest``).
CACHE_VERSION = 7
BUILD_JOB = "jaxbench_env.candidate_process:build_artifacts"
MAX_CANDIDATE_ERROR_CHARS = 4000
REFERENCE_TIMEOUT_S = 1800.0  # the XLA reference's judging: at least this, whatever candidates get
_CANDIDATE_STAGES = ("load", "trace", "export", "done")


def tpu_available() -> bool:
    """A TPU chip is attached to this machine (checked without starting jax)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "tpu" if tpu_available() else "sim"
    if backend == "tpu" and not tpu_available():
        raise ValueError("backend 'tpu' needs a TPU on this machine; use backend='sim' for the v6e simulator")
    return backend


def package_versions() -> dict:
    """The versions a result depends on: jax, jaxlib, libtpu, this package and its code."""
    out = {}
    for pkg in ("jax", "jaxlib", "libtpu", "jaxbench-gym"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    out["code"] = code_digest()
    return out


def source_digest(*packages: Path) -> str:
    """A digest of the ``.py`` files under ``packages`` (names and contents)."""
    h = hashlib.sha256()
    for package in packages:
        for path in sorted(Path(package).rglob("*.py")):
            h.update(path.relative_to(Path(package).parent).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """The digest of the code that builds, judges and prices a candidate (this package, the
    workloads with their references, inputs, adapters, templates and experts): a result
    cached under other code is never reused, whether or not anyone bumped CACHE_VERSION."""
    return source_digest(Path(__file__).resolve().parent, Path(workloads.__file__).resolve().parent)


class CandidateFailed(RuntimeError):
    """The candidate's process did not answer: timeout, memory, crash. The message says which."""


@dataclass
class EvalResult:
    """What one evaluation found. ``time_ms`` is a prediction when timing_source is v6e-sim."""

    workload: str
    backend: str
    timing_source: str
    compiled: bool
    correct: bool | None  # None: not checked (a shipped expert jax cannot interpret on a CPU)
    max_abs_err: float | None = None
    time_ms: float | None = None
    baseline_ms: float | None = None
    error: str | None = None
    stage: str = ""
    cached: bool = False
    details: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.compiled and self.correct is not False and self.time_ms is not None and self.time_ms > 0

    @property
    def speedup(self) -> float | None:
        if not self.ok or not self.baseline_ms:
            return None
        return self.baseline_ms / self.time_ms

    @property
    def trusted_timing(self) -> bool:
        """False where a bound set ``time_ms`` rather than a measurement or the simulator's
        model: the physical floor, or an upper bound on work the model could not evaluate
        (``details.sim.bounds`` says which)."""
        return self.time_ms is not None and not (self.details.get("sim") or {}).get("bounds")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speedup"] = self.speedup
        d["trusted_timing"] = self.trusted_timing
        return d


class Evaluator:
    def __init__(self, workload: str, config: Mapping[str, Any] | None = None, backend: str = "auto",
                 cache_dir=None, timeout_s: float = DEFAULT_TIMEOUT_S, memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.workload = workloads.get(workload, config)
        self.backend = resolve_backend(backend)
        self.timing_source = TIMING_SOURCE[self.backend]
        self.cache = ResultCache(cache_dir)
        self.worker = Worker(self.backend, timeout_s=timeout_s, memory_bytes=memory_bytes)
        self.sandbox = Sandbox(timeout_s=timeout_s, memory_bytes=memory_bytes, hidden_paths=(str(self.cache.root),))
        # Measured times depend on the chip: key them by its type where the TPU VM names it.
        self._versions = {**package_versions(), "tpu_type": os.environ.get("TPU_ACCELERATOR_TYPE") if self.backend == "tpu" else None,
                          "sim": f"{sim.FEATURES_VERSION}/{sim.calibration().version}" if self.backend == "sim" else None}
        self._baseline: EvalResult | None = None
        # Told the name of each stage as an uncached evaluation starts it ("build" in the
        # candidate's sandbox, then the judge's: verify, compile, check, time).
        self.on_stage: Callable[[str], None] | None = None

    def _key(self, candidate: Candidate | None, compile_only: bool) -> str:
        return content_key(
            v=CACHE_VERSION, workload=self.workload.name, config=self.workload.config, backend=self.backend,
            candidate=None if candidate is None else candidate.key(), compile_only=compile_only,
            versions=self._versions,
        )

    def _run(self, candidate: Candidate | None, check: bool = True) -> EvalResult:
        if candidate is not None:
            self.baseline()  # judged before any candidate of this workload runs
        expert_unchecked = candidate is not None and self._uninterpretable_expert(candidate)
        compile_only = candidate is not None and (expert_unchecked or not check)
        key = self._key(candidate, compile_only)
        hit = self.cache.get(key)
        if hit is not None:
            return EvalResult(**{**hit, "cached": True})
        base = dict(workload=self.workload.name, backend=self.backend, timing_source=self.timing_source)
        request = {"workload": self.workload.name, "config": self.workload.config, "backend": self.backend}
        try:
            if candidate is None:
                # Our own reference, never a candidate's code: a limit of its own, since without
                # it no candidate can be scored (RPA's takes minutes to compile on a busy machine).
                answer = self.worker.call({**request, "op": "baseline"}, on_stage=self.on_stage,
                                          timeout_s=max(self.worker.timeout_s, REFERENCE_TIMEOUT_S))
            else:
                answer = self._judge_candidate(request, candidate, compile_only, expert_unchecked)
        except (WorkerError, CandidateFailed) as e:  # not cached: a timeout may not repeat on a quieter machine
            return EvalResult(**base, compiled=False, correct=False, error=str(e),
                              stage="sandbox" if isinstance(e, CandidateFailed) else "judge")
        result = EvalResult(**base, **answer)
        self.cache.put(key, {k: v for k, v in asdict(result).items() if k != "cached"})
        return result

    def _judge_candidate(self, request: dict, candidate: Candidate, compile_only: bool, expert_unchecked: bool) -> dict:
        """Build the candidate's programs in the sandbox, then have the judge judge them,
        climbing the check-size ladder where the judge finds a size boundary."""
        # The workload's own expert file, byte for byte, is priced as it runs even where no
        # check size shows all it does (a k-step that is neither the first nor the last).
        request = {**request, "own_expert": candidate.source == self.workload.expert_source()}
        return climb_ladder(len(self.workload.check_rungs()),
                            lambda rung: self._judge_at(request, candidate, compile_only, expert_unchecked, rung))

    def _judge_at(self, request: dict, candidate: Candidate, compile_only: bool, expert_unchecked: bool,
                  min_rung: int) -> dict:
        if self.on_stage is not None:
            self.on_stage("build")
        built = self.sandbox.run(BUILD_JOB, {**request, "source": candidate.source, "min_rung": min_rung,
                                             "schedule": dict(candidate.schedule)})
        if built.error is not None:
            raise CandidateFailed(built.error)
        manifest = built.manifest or {}
        stage_s = {k: float(v) for k, v in (manifest.get("stage_s") or {}).items()
                   if isinstance(k, str) and isinstance(v, (int, float))}
        stage_s["sandbox"] = built.wall_s
        if manifest.get("error") is not None:  # the candidate's own failure: data, shown as text
            stage = manifest.get("stage")
            return {"compiled": False, "correct": False, "stage": stage if stage in _CANDIDATE_STAGES else "load",
                    "error": str(manifest["error"])[:MAX_CANDIDATE_ERROR_CHARS], "details": {"stage_s": stage_s}}
        rung = manifest.get("rung")
        if not isinstance(rung, int) or rung < min_rung:
            raise CandidateFailed(f"the candidate's process reported check rung {rung!r}, below {min_rung}")
        answer = self.worker.call({
            **request, "op": "judge", "artifacts": built.blobs, "rung": rung,
            "interpret_error": str(manifest.get("interpret_error") or "")[:MAX_CANDIDATE_ERROR_CHARS],
            "compile_only": compile_only, "trusted_expert": expert_unchecked,
            "unchecked_because": "not checked: timing only" if compile_only and not expert_unchecked else None},
            on_stage=self.on_stage)
        answer["details"]["stage_s"] = {**stage_s, **answer["details"].get("stage_s", {})}
        return answer

    def _uninterpretable_expert(self, candidate: Candidate) -> bool:
        # Trusted by content: only the workload's own expert file, byte for byte, skips the
        # CPU check; any edit to it is checked (and fails) like every other candidate.
        wl = self.workload
        return (self.backend == "sim" and not wl.expert_checks_on_cpu
                and candidate.source == wl.expert_source())

    def expert(self, check: bool = True) -> EvalResult:
        """The workload's expert kernel (jax's shipped Pallas kernel, JAXBench's tuned blocks)."""
        source = self.workload.expert_source()
        if source is None:
            raise ValueError(f"{self.workload.name} has no expert kernel; "
                             f"experts exist for: {', '.join(sorted(workloads.with_expert()))}")
        return self.evaluate(Candidate(source, {}), check)

    def baseline(self) -> EvalResult:
        """The XLA reference's result (time_ms is the baseline every speedup divides)."""
        if self._baseline is None:
            result = self._run(None)
            if not result.ok:
                raise RuntimeError(f"the XLA baseline of {self.workload.name} failed: {result.error}")
            self._baseline = result
        return self._baseline

    def evaluate(self, candidate: Candidate, check: bool = True) -> EvalResult:
        """Compile, check (unless ``check`` is False: ``correct`` is then None) and time a candidate."""
        result = self._run(candidate, check)
        result.baseline_ms = self.baseline().time_ms
        return result

    def __deepcopy__(self, memo):
        # A handle on a worker process and a cache: copies of an env (gym.make deep-copies
        # its kwargs) share it, as forks do.
        return self

    def close(self) -> None:
        self.worker.close()
        self.sandbox.close()


def climb_ladder(n_rungs: int, judge_at) -> dict:
    """``judge_at(min_rung)``'s answer, from rung 0 up the check-size ladder: where the judge
    finds a size boundary between the check size and the full size (its answer's
    ``details.size_boundary``), the candidate is built again at the next rung, until the
    last of ``n_rungs``. ``details.climbed`` says why each rung was left."""
    climbed, rung = [], 0
    while True:
        answer = judge_at(rung)
        details = answer["details"]
        if not details.pop("size_boundary", False) or details.get("check_rung") is None:
            break
        climbed.append(f"rung {details['check_rung']}: {answer['error']}")
        rung = details["check_rung"] + 1
        if rung >= n_rungs:
            answer["error"] = "no check size where the programs are one program:\n" + "\n".join(climbed)
            break
    if climbed:
        answer["details"]["climbed"] = climbed
    return answer


def reward_of(result: EvalResult, mode: str, penalty: float, previous_speedup: float | None = None) -> float:
    """The step reward: ``penalty`` unless compiled and correct, else by ``mode``."""
    s = result.speedup
    if s is None:
        return float(penalty)
    if mode == "speedup":
        return float(s)
    if mode == "log_speedup":
        return float(math.log(s))
    if mode == "improvement":
        return float(s - (previous_speedup or 0.0))
    raise ValueError(f"reward must be 'speedup', 'log_speedup' or 'improvement', got {mode!r}")
