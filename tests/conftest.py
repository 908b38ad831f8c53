"""Shared fixtures: one result cache and one evaluator (worker process) per workload config.

Evaluations are cached by content, so tests that evaluate the same candidate share the
compile and the check instead of repeating them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxbench_env.aot import prepare_process

# Before anything imports jax: the tests export and compile for v6e in this process too, beside
# the evaluators' workers and sandboxes, so libtpu must allow several processes to load it.
prepare_process()

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    # One cache for the whole run: under pytest-xdist the workers share it (the run's base
    # temporary directory is the parent of each worker's), as nodes sharing a directory do.
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jaxbench-cache"
    path.mkdir(exist_ok=True)
    os.environ["JAXBENCH_CACHE_DIR"] = str(path)  # also for subprocesses the tests start
    return path


# Each evaluator keeps a worker and a sandbox process (~0.5 GB each); fifty kept for the
# session filled 23 GB. Past this many, the least recently handed out is closed: it starts
# its processes again if it is used again.
LIVE_EVALUATORS = 4


@pytest.fixture(scope="session")
def evaluators(cache_dir):
    """evaluators(name, config=None) -> a shared Evaluator."""
    from jaxbench_env.evaluation import Evaluator

    made = {}
    live = []  # keys of the evaluators whose processes may be running, most recent last

    def get(name, config=None, timeout_s=300.0):
        key = (name, repr(sorted((config or {}).items())), timeout_s)
        if key not in made:
            made[key] = Evaluator(name, config, backend="sim", cache_dir=cache_dir, timeout_s=timeout_s)
        if key in live:
            live.remove(key)
        live.append(key)
        while len(live) > LIVE_EVALUATORS:
            made[live.pop(0)].close()
        return made[key]

    yield get
    for ev in made.values():
        ev.close()


@pytest.fixture(scope="session")
def make_env(evaluators):
    """make_env(name, config=None, **kwargs) -> a JAXBenchEnv on a shared evaluator."""
    import gymnasium as gym

    import jaxbench_env  # noqa: F401 - registers the envs

    def make(name, config=None, timeout_s=300.0, **kwargs):
        ev = evaluators(name, config, timeout_s)
        return gym.make(f"JAXBench/{name}-v0", evaluator=ev, **kwargs).unwrapped

    return make


@pytest.fixture(scope="session")
def cli(cache_dir):
    """cli(*args) runs ``python -m jaxbench_env ARGS`` on the shared cache; a CompletedProcess."""
    env = {**os.environ, "JAXBENCH_CACHE_DIR": str(cache_dir)}

    def run(*args, timeout=600):
        return subprocess.run([sys.executable, "-m", "jaxbench_env", *args], capture_output=True, text=True,
                              env=env, timeout=timeout)

    return run
