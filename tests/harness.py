"""Shared helpers for the per-workload tests: a workload at its check size, judged by the
product's own correctness check (``jaxbench_env.pipeline``), so the tests and the
environment cannot disagree about what "correct" means."""

from __future__ import annotations

import functools

import numpy as np

from jaxbench_env import pipeline


class AtCheckSize:
    """Seeded inputs and reference outputs of ``workload`` at its check size, made once."""

    def __init__(self, workload):
        self.w = workload
        self.cfg = workload.check_config()

    def expected(self, seed: int) -> pipeline.Expected:
        return pipeline.expected(self.w, self.cfg, seed)

    def inputs(self, seed: int) -> tuple:
        return self.expected(seed).inputs

    @functools.lru_cache(maxsize=None)
    def ref(self, seed: int) -> np.ndarray:
        return np.asarray(self.expected(seed).ref, dtype=np.float32)

    def rejects(self, bad, seed: int = 0) -> bool:
        """True when the correctness check fails ``bad`` as an output for ``seed``."""
        e = self.expected(seed)
        try:
            pipeline.compare_outputs(np.asarray(bad, np.float32), e.target, e.atol, e.rtol)
        except pipeline.StageError:
            return True
        return False


def schedule_id(schedule: dict) -> str:
    """A readable pytest id for a schedule override ("default" for none)."""
    return "-".join(f"{k}{v}" for k, v in schedule.items()) or "default"


def assert_template_correct(workload, schedule: dict) -> None:
    """The template at ``schedule`` (over the defaults) passes the environment's check:
    interpret mode at check size, 3 seeds, structure, dtype, allclose, no NaN."""
    space = workload.space()
    full = {**space.default(), **schedule}
    assert space.check(full) is None, space.check(full)
    assert workload.schedule_space(workload.check_config()).check(full) is None
    module = pipeline.load_module(workload.template_source(), workload.config, full)
    assert set(module.SCHEDULE) == set(space.names)
    try:
        pipeline.check(module, workload, on_tpu=False)
    except pipeline.StageError as e:
        raise AssertionError(f"template at {full} failed the check: {e}") from None


def assert_expert_correct(workload) -> None:
    """The workload's expert file passes the environment's interpret-mode check at check size."""
    module = pipeline.load_module(workload.expert_source(), workload.config, {})
    try:
        pipeline.check(module, workload, on_tpu=False)
    except pipeline.StageError as e:
        raise AssertionError(f"expert of {workload.name} failed the check: {e}") from None
