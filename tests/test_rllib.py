"""PPO (RLlib new API stack) with the exact move mask, one policy over two workloads."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")

from jaxbench_env.rllib import KnobMoveEnv, read_log  # noqa: E402

# Tiny configs: every legal schedule's interpret check takes a second or two.
CONFIGS = {"gemm": {"M": 256, "K": 256, "N": 256}, "rmsnorm": {"batch": 1, "seq_len": 256, "emb_dim": 1024}}


def test_knob_moves_are_exactly_masked(cache_dir):
    env = KnobMoveEnv({"workloads": ["gemm", "rmsnorm"], "configs": CONFIGS, "cache_dir": str(cache_dir),
                       "max_steps": 4})
    try:
        obs, info = env.reset(seed=0)
        assert info["workload"] == "gemm" and env.observation_space.contains(obs)
        n = env.action_space.n
        assert n == 5 + 4 + 5 + 2 + 2 + 2  # gemm's knob values, in a row; rmsnorm's (8 + 2) padded to it
        mask = obs[-n:]
        assert np.array_equal(mask, env.mask())
        for a in range(n):  # a move is legal exactly when its bit is set
            assert bool(mask[a]) == (env.env.schedule_space.check(env.move(a)) is None), a
        masked = int(np.flatnonzero(mask == 0)[0])
        _, reward, *_ , info = env.step(masked)
        assert reward == env.env.penalty and "masked out" in info["error"]
        env.reset()
        assert env.names[env.index] == "rmsnorm"
        assert not env.mask()[env.sizes[env.index]:].any()  # moves rmsnorm does not have
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one Ray user at a time
def test_ppo_never_samples_a_masked_move_and_learns_across_workloads(cache_dir, tmp_path):
    from jaxbench_env import rllib

    result = rllib.train(["gemm", "rmsnorm"], iters=2, out=tmp_path, configs=CONFIGS, cache_dir=str(cache_dir),
                         max_steps=4, train_batch_size=16, minibatch_size=8)
    steps = read_log(tmp_path / "log", "steps")
    assert len(steps) >= 32 and all(s["allowed"] for s in steps)  # nothing sampled outside the mask
    assert {s["workload"] for s in steps} == {"gemm", "rmsnorm"}  # one policy, both workloads
    assert sum(bool(s["correct"]) for s in steps) == len(steps)  # masked moves are legal, and all compile
    assert len(result["curve"]) == 2 and result["curve"][-1]["env_steps"] >= 32
    with open(tmp_path / "learning_curve.csv") as f:
        assert [int(r["iteration"]) for r in csv.DictReader(f)] == [1, 2]
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    best = json.loads((tmp_path / "best.json").read_text())
    assert set(best) == {"gemm", "rmsnorm"} and all(b["speedup"] > 0 for b in best.values())
