"""The expert kernels (jax's shipped Pallas TPU kernels with JAXBench's tuned blocks): the
expert policy in the env, ``jaxbench baseline --expert``, and the compile-only rule for an
expert jax cannot interpret on a CPU."""

from __future__ import annotations

import json

import pytest

import workloads
from conftest import SMALL_GEMM
from jaxbench_env.candidate import Candidate
from jaxbench_env.evaluation import Evaluator
from jaxbench_env.judge import COMPILE_ONLY_NOTE
from policies import ExpertPolicy, make_policy, run_policy


def test_experts_are_listed_and_readable():
    named = set(workloads.with_expert())
    assert {"gemm", "flash_attention"} <= named
    for name in named:
        source = workloads.get(name).expert_source()
        assert "jax.experimental.pallas.ops.tpu" in source and "def workload(" in source
    assert workloads.get("rmsnorm").expert_source() is None


def test_expert_policy_steps_to_a_correct_compiled_kernel(make_env):
    # N below the expert's tuned block (2048): its blocks shrink to the problem
    env = make_env("gemm", {"M": 1024, "K": 1024, "N": 1024}, action_mode="source")
    records = run_policy(make_policy("expert"), env, steps=2)
    first, again = records
    assert first["compiled"] and first["correct"] is True, first["error"]
    assert first["speedup"] > 0 and first["reward"] == pytest.approx(first["speedup"])
    assert again["time_ms"] == first["time_ms"]  # the same candidate, answered by the cache
    assert env.source == workloads.get("gemm").expert_source()


def test_expert_policy_refuses_what_it_cannot_do(make_env):
    with pytest.raises(ValueError, match="action_mode"):
        ExpertPolicy().act(make_env("gemm", SMALL_GEMM))  # schedule mode
    with pytest.raises(ValueError, match="no expert"):
        ExpertPolicy().act(make_env("rmsnorm", {"batch": 1, "seq_len": 1024}, action_mode="source"))


def test_only_the_exact_expert_file_skips_the_cpu_check(cache_dir):
    """Pretend gemm's interpreter support were missing: its expert file, byte for byte, is
    compiled and timed but reported unchecked; one edit and it is checked like any candidate."""
    ev = Evaluator("gemm", SMALL_GEMM, backend="sim", cache_dir=cache_dir)
    try:
        ev.workload.expert_checks_on_cpu = False  # this instance only
        exact = ev.expert()
        assert exact.compiled and exact.correct is None and exact.ok
        assert exact.details["check"] == COMPILE_ONLY_NOTE and exact.max_abs_err is None
        edited = ev.evaluate(Candidate(ev.workload.expert_source() + "\n# edited\n", {}))
        assert edited.compiled and edited.correct is True and edited.max_abs_err is not None
        assert "check" not in edited.details
    finally:
        ev.close()


def test_cli_baseline_with_expert(cli):
    p = cli("baseline", "gemm", "--config", "M=1024,K=1024,N=2048", "--expert", "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    expert = obj["expert"]
    assert expert["compiled"] and expert["correct"] is True and expert["timing_source"] == "v6e-sim"
    assert expert["speedup"] == pytest.approx(obj["time_ms"] / expert["time_ms"])
    human = cli("baseline", "gemm", "--config", "M=1024,K=1024,N=2048", "--expert")
    assert human.returncode == 0 and "expert:" in human.stdout and "predicted" in human.stdout
    bad = cli("baseline", "rmsnorm", "--expert")
    assert bad.returncode == 2 and "no expert" in bad.stderr and "gemm" in bad.stderr
