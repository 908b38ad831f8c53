"""Shared helpers for the per-workload tests: a workload at its check size, judged by the
product's own judge (``jaxbench_env.judge``) on the programs the product's own candidate
process exports, so the tests and the environment cannot disagree about what "correct"
means. (The tests run both sides in-process: they trust the templates they test.)"""

from __future__ import annotations

import functools

import numpy as np

from jaxbench_env import candidate_process, judge
from jaxbench_env.evaluation import climb_ladder

TEST_SEEDS = (0, 1, 2)


class AtCheckSize:
    """Seeded inputs and reference outputs of ``workload`` at its check size, made once."""

    def __init__(self, workload):
        self.w = workload
        self.cfg = workload.check_config()

    def expected(self, seed: int) -> judge.Expected:
        return judge.expected(self.w, self.cfg, seed)

    def inputs(self, seed: int) -> tuple:
        return self.expected(seed).inputs

    @functools.lru_cache(maxsize=None)
    def ref(self, seed: int) -> np.ndarray:
        return np.asarray(self.expected(seed).ref, dtype=np.float32)

    def rejects(self, bad, seed: int = 0) -> bool:
        """True when the correctness check fails ``bad`` as an output for ``seed``."""
        e = self.expected(seed)
        try:
            judge.compare_outputs(np.asarray(bad, np.float32), e.target, e.atol, e.rtol)
        except judge.Rejected:
            return True
        return False


def schedule_id(schedule: dict) -> str:
    """A readable pytest id for a schedule override ("default" for none)."""
    return "-".join(f"{k}{v}" for k, v in schedule.items()) or "default"


def judge_check(workload, source: str, schedule: dict) -> float:
    """Build ``source``'s programs as the sandbox would, then verify and check them as the
    judge does (3 seeds, climbing the check-size ladder as the evaluator does); the max abs
    error, or AssertionError."""
    request = {"workload": workload.name, "config": workload.config, "source": source, "schedule": schedule,
               "backend": "sim"}

    def check_at(min_rung: int) -> dict:
        manifest, blobs = candidate_process.build_artifacts({**request, "min_rung": min_rung})
        assert manifest["error"] is None, manifest["error"]
        details = {"check_rung": manifest["rung"]}
        try:
            programs, check_config, *_ = judge.verify_request(workload, {**request, "artifacts": blobs,
                                                                     "rung": manifest["rung"]})
            assert "check_cpu" in programs, manifest.get("interpret_error")
            err = judge.check_outputs(workload, programs["check_cpu"], check_config, TEST_SEEDS)
            return {"error": None, "max_abs_err": err, "details": details}
        except judge.Rejected as e:
            return {"error": str(e), "details": {**details, "size_boundary": isinstance(e, judge.SizeBoundary)}}

    answer = climb_ladder(len(workload.check_rungs()), check_at)
    assert answer["error"] is None, answer["error"]
    return answer["max_abs_err"]


def assert_template_correct(workload, schedule: dict) -> None:
    """The template at ``schedule`` (over the defaults) passes the environment's check:
    interpret mode at check size, 3 seeds, structure, dtype, allclose, no NaN."""
    space = workload.schedule_space()
    full = {**space.default(), **schedule}
    assert space.check(full) is None, space.check(full)
    assert workload.schedule_space(workload.check_config()).check(full) is None
    module = candidate_process.load_module(workload.template_source(), workload.config, full)
    assert set(module.SCHEDULE) == set(space.names)
    try:
        judge_check(workload, workload.template_source(), full)
    except AssertionError as e:
        raise AssertionError(f"template at {full} failed the check: {e}") from None


def assert_expert_correct(workload) -> None:
    """The workload's expert file passes the environment's interpret-mode check."""
    try:
        judge_check(workload, workload.expert_source(), {})
    except AssertionError as e:
        raise AssertionError(f"expert of {workload.name} failed the check: {e}") from None


def compile_full_size(workload, source: str, schedule: dict):
    """Build ``source``'s programs and compile the full-size one for v6e as the judge does;
    returns (compiled, bundle profiles, the full-size Exported)."""
    manifest, blobs = candidate_process.build_artifacts(
        {"workload": workload.name, "config": workload.config, "source": source, "schedule": schedule})
    assert manifest["error"] is None, manifest["error"]
    full = judge.read_artifacts(blobs)["full_tpu"]
    compiled, profiles = judge.compile_v6e(full.call, full.in_avals)
    return compiled, profiles, full


def judged_time_only(workload, source: str, schedule: dict) -> dict:
    """The judge's result for ``source`` built as the sandbox would, verified, compiled and
    priced but not checked (in-process: for the simulator's tests), climbing the ladder on a
    size boundary as the evaluator does."""
    request = {"workload": workload.name, "config": workload.config, "source": source, "schedule": schedule,
               "backend": "sim", "compile_only": True}

    def judge_at(min_rung: int) -> dict:
        manifest, blobs = candidate_process.build_artifacts({**request, "min_rung": min_rung})
        if manifest["error"] is not None:
            return {"error": manifest["error"], "compiled": False, "details": {}}
        return judge.judge({**request, "artifacts": blobs, "rung": manifest["rung"]})

    return climb_ladder(len(workload.check_rungs()), judge_at)
