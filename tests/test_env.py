"""The environment's contract: registration, spaces, rewards, fork, config overrides."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.passive_env_checker import env_reset_passive_checker

import workloads
from action_space.source_edit import edit_block
from conftest import SMALL_GEMM


def test_gym_make_in_fresh_process_registers_every_workload():
    code = (
        "import gymnasium as gym, workloads\n"
        "env = gym.make('jaxbench_env:JAXBench/gemm-v0')\n"
        "print(env.spec.nondeterministic, type(env.action_space).__name__)\n"
        "print(sorted(i for i in gym.registry if i.startswith('JAXBench/')) == "
        "sorted(f'JAXBench/{n}-v0' for n in workloads.WORKLOADS))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "MultiDiscrete", "True"]


MODES = ("schedule", "source", "both")
# Gymnasium's full checker steps with random actions, each a full-size compile and check: it
# runs on one workload of each kind (the step path is shared; spaces and resets are checked
# on all 50 below).
CHECKED_IN_FULL = ("gemm_add_relu", "conv2d_relu_biasadd", "flash_attention", "paged_attention", "mixtral_moe")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CHECKED_IN_FULL)
def test_check_env(make_env, name, mode):
    check_env(make_env(name, action_mode=mode, max_steps=4), skip_render_check=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(workloads.WORKLOADS))
def test_every_workload_resets_to_its_compiled_correct_template(make_env, name):
    """Every template's default schedule passes the product's own check here (the
    per-workload tests check other schedules in-process)."""
    for mode in MODES:
        env = make_env(name, action_mode=mode, max_steps=4)
        obs, info = env_reset_passive_checker(env, seed=0)  # obs in its space, info a dict
        # The starting point is the template's default schedule: compiled for v6e and correct.
        assert info["compiled"] and info["correct"], info["error"]
        assert info["timing_source"] == "v6e-sim" and info["time_ms"] > 0 and info["baseline_ms"] > 0
        assert env.action_space.contains(env.action_space.sample())


def test_schedule_step_reward_is_baseline_over_candidate_time(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="schedule")
    obs, info = env.reset(seed=0)
    space = env.schedule_space
    action = space.encode({**space.default(), "block_n": 2048, "block_m": 256})
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["compiled"] and info["correct"], info["error"]
    assert reward == pytest.approx(info["baseline_ms"] / info["time_ms"])
    assert info["speedup"] == pytest.approx(reward)
    assert info["schedule"]["block_n"] == 2048 and "block_n" in info["source"]
    assert obs["last_speedup"][0] == pytest.approx(reward, rel=1e-5)
    assert obs["step"][0] == 1 and not terminated and not truncated
    assert list(obs["schedule"]) == list(action)


def test_reward_modes_and_truncation(make_env):
    log_env = make_env("gemm", SMALL_GEMM, reward="log_speedup", max_steps=1)
    _, start = log_env.reset(seed=0)
    action = log_env.schedule_space.encode({**log_env.schedule_space.default(), "block_m": 256})
    _, reward, _, truncated, info = log_env.step(action)
    assert reward == pytest.approx(math.log(info["speedup"]))
    assert truncated

    imp_env = make_env("gemm", SMALL_GEMM, reward="improvement")
    _, start = imp_env.reset(seed=0)
    _, reward, _, _, info = imp_env.step(action)
    assert reward == pytest.approx(info["speedup"] - start["speedup"])


def test_timing_only_explores_schedules_unchecked_and_checks_the_best(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="both", timing_only=True)
    _, start = env.reset(seed=0)
    assert start["checked"] is False and start["correct"] is None and start["speedup"] > 0
    space = env.schedule_space
    _, reward, _, _, info = env.step({"schedule": space.encode({**space.default(), "block_m": 256}), "source": ""})
    assert not info["checked"] and info["correct"] is None and reward == pytest.approx(info["speedup"])
    assert env.fork().timing_only
    best = env.check_best()
    assert best.correct is True and best.speedup == pytest.approx(env.best_speedup)  # checked, same prediction
    # An edited source is always checked: a wrong kernel is not rewarded.
    edit = edit_block("acc_ref[...] += ", "acc_ref[...] -= ")
    _, reward, _, _, info = env.step({"schedule": space.encode(space.default()), "source": edit})
    assert info["checked"] and info["correct"] is False and reward == env.penalty


def test_fork_branches_without_replaying(make_env):
    env = make_env("gemm", SMALL_GEMM)
    env.reset(seed=0)
    child = env.fork()
    space = env.schedule_space
    child.step(space.encode({**space.default(), "block_m": 256}))
    assert child.schedule["block_m"] == 256 and child.steps == 1
    assert env.schedule == space.default() and env.steps == 0
    state = child.get_state()
    env.set_state(state)
    assert env.schedule["block_m"] == 256 and env.steps == 1


def test_config_override_changes_the_problem_and_the_baseline(make_env):
    small = make_env("gemm", SMALL_GEMM)
    _, info_small = small.reset(seed=0)
    other = make_env("gemm", {"M": 2048, "K": 1024, "N": 2048})
    _, info_other = other.reset(seed=0)
    assert info_small["baseline_ms"] != info_other["baseline_ms"]
    assert small.workload.config["M"] == 1024 and other.workload.config["M"] == 2048
    with pytest.raises(ValueError, match="unknown config keys"):
        make_env("gemm", {"seq_len": 2048})


def test_candidate_config_never_overrides_the_env(make_env):
    """A JAXBench-style file with its own CONFIG is evaluated at the env's shapes."""
    env = make_env("gemm", SMALL_GEMM, action_mode="source")
    env.reset(seed=0)
    src = "CONFIG = {'M': 8, 'K': 8, 'N': 8}\n\ndef workload(a, b):\n    return a @ b\n"
    _, reward, _, _, info = env.step(src)
    assert info["correct"] and info["compiled"], info["error"]
    assert reward > 0


def test_source_edit_and_schedule_compose(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="both")
    env.reset(seed=0)
    space = env.schedule_space
    edit = edit_block('SCHEDULE = {"block_m": 512,', 'SCHEDULE = {"block_m": 256,')
    sched = space.encode({**space.default(), "block_n": 2048})
    _, reward, _, _, info = env.step({"schedule": sched, "source": edit})
    assert info["correct"], info["error"]
    assert '"block_m": 256' in info["source"] and info["schedule"]["block_n"] == 2048
    # An empty source in "both" mode keeps the current (edited) source.
    _, _, _, _, info2 = env.step({"schedule": space.encode(space.default()), "source": ""})
    assert '"block_m": 256' in info2["source"]


def test_action_mask_excludes_vmem_busting_moves(make_env):
    # f32, all of K=8192 in one step: 1024 x 8192 blocks of A and 8192 x 1024 of B exceed 100 MiB
    env = make_env("gemm", {"dtype": "float32"})
    env.schedule = {**env.schedule_space.default(), "block_m": 1024, "accumulator": "none"}
    masks = env.action_masks()
    names = env.schedule_space.names
    block_n = env.schedule_space.knobs[names.index("block_n")]
    assert masks[names.index("block_n")][block_n.values.index(1024)] == 0
    assert masks[names.index("block_n")][block_n.values.index(128)] == 1


def test_describe_is_prompt_ready(make_env):
    env = make_env("gemm", SMALL_GEMM)
    env.reset(seed=0)
    text = env.describe()
    assert "predicted" in text and "def workload" in text and "def reference" in text
    assert "block_m" in text


def test_observation_is_numeric_and_fixed_size(make_env):
    env = make_env("gemm", SMALL_GEMM)
    obs, _ = env.reset(seed=0)
    assert all(isinstance(v, np.ndarray) and v.dtype.kind in "fiu" for v in obs.values())
    assert obs["action_mask"].shape == (int(env.schedule_space.nvec.sum()),)


def test_start_schedule_fits_a_config_smaller_than_the_default_blocks(make_env):
    env = make_env("gemm", {"M": 256, "K": 256, "N": 256})
    obs, info = env.reset(seed=0)
    assert info["correct"] and info["compiled"], info["error"]
    assert env.schedule_space.check(env.schedule) is None
    assert all(env.schedule[k] <= 256 for k in ("block_m", "block_k", "block_n"))


def test_source_edit_of_schedule_literal_sets_the_schedule():
    from action_space.source_edit import read_schedule, with_schedule

    src = 'import x\nSCHEDULE = {"block_m": 512, "order": "mn"}\n\ndef workload(a):\n    return a\n'
    assert read_schedule(src) == {"block_m": 512, "order": "mn"}
    edited = with_schedule(src, {"block_m": 256, "order": "nm"})
    assert read_schedule(edited) == {"block_m": 256, "order": "nm"} and edited.endswith("return a\n")
    assert read_schedule("def workload(a): return a") is None
