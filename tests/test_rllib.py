"""PPO (RLlib new API stack) trains on the schedule-action gemm env: examples/rllib_ppo.py's config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rllib_ppo.py"
# Tiny gemm: every legal schedule runs <= 8 grid steps in the interpret check, so the
# ~32 sampled steps (mostly random, many rejected by the schedule check) stay fast.
TINY_GEMM = {"M": 256, "K": 256, "N": 256}


def load_example():
    spec = importlib.util.spec_from_file_location("rllib_ppo_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_ppo_two_iterations(cache_dir):
    import ray

    example = load_example()
    try:
        results = example.train(iters=2, cache_dir=str(cache_dir), config=TINY_GEMM, max_steps=8,
                                train_batch_size=16, minibatch_size=8)
    finally:
        ray.shutdown()
    assert len(results) == 2
    last = results[-1]
    runners = last["env_runners"]
    assert runners["num_env_steps_sampled_lifetime"] >= 16
    assert runners.get("num_episodes_lifetime", 0) >= 1
    assert "episode_return_mean" in runners
    assert "learners" in last
