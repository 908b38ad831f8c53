"""RLlib (new API stack) on JAXBench: one PPO policy over several workloads, actions masked exactly.

The schedule env's action sets every knob at once (``MultiDiscrete``), and its
``action_mask`` says which value of each knob is legal with the others as they are: a
joint choice legal knob by knob can still be illegal together, and would get the penalty.
``KnobMoveEnv`` makes the mask exact instead: an action is one move, "set knob i to value
v" (``Discrete``, every knob's values in a row), and a move is legal exactly when its
bit in the mask is set. It serves several workloads from one padded space: each reset moves
to the next workload, the observation carries the workload's one-hot identity, and the
moves a workload does not have are masked out.

``MaskedPPOModule`` is PPO's default torch module with the mask applied to its action
logits (the mask rides at the end of the flat observation), so masked moves are never
sampled. ``train`` runs PPO and writes its learning curve (CSV and PNG) and the best
schedule found per workload.

Observation (flat float32): workload features, the schedule as one-hot values per knob
(padded), last speedup, best speedup, whether the last candidate was correct, the step
fraction, the workload's one-hot identity, then the move mask.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from workloads.base import N_FEATURES

OBS_LIMIT = 64.0  # observations are clipped to +-64 (speedups beyond that carry no more signal)


class KnobMoveEnv(gym.Env):
    """Schedule search on one or several workloads by single-knob moves, exactly masked.

    ``env_config``: ``workloads`` (names), ``reset_workloads`` (those resets cycle through;
    default all), ``configs`` (name -> config overrides),
    ``backend``, ``cache_dir``, ``max_steps``, ``log_dir`` (where each step and each
    workload's best are written as JSON lines, for the learning curve and the tests).
    Reward: the schedule env's (speedup of a correct candidate, else the penalty).
    """

    metadata = {"render_modes": [], "render_fps": 1}

    def __init__(self, env_config: Mapping[str, Any] | None = None):
        from jaxbench_env.env import JAXBenchEnv

        cfg = dict(env_config or {})
        self.names = list(cfg.get("workloads") or ["gemm"])
        configs = cfg.get("configs") or {}
        self.envs = [JAXBenchEnv(n, backend=cfg.get("backend", "sim"), action_mode="schedule",
                                 max_steps=int(cfg.get("max_steps", 8)), config=configs.get(n),
                                 cache_dir=cfg.get("cache_dir")) for n in self.names]
        self.sizes = [int(e.schedule_space.nvec.sum()) if len(e.schedule_space.knobs) else 1 for e in self.envs]
        self.n = max(self.sizes)
        self.action_space = spaces.Discrete(self.n)
        dim = N_FEATURES + self.n + 4 + len(self.names) + self.n
        self.observation_space = spaces.Box(-OBS_LIMIT, OBS_LIMIT, (dim,), np.float32)
        # Resets cycle through these (default: all; a held-out workload can share the space
        # and never be stepped on in training). Sub-envs of one runner start on different ones.
        self.cycle = [self.names.index(n) for n in (cfg.get("reset_workloads") or self.names)]
        self.position = getattr(env_config, "vector_index", 0) % len(self.cycle) - 1
        self.index = self.cycle[self.position]
        self.log_dir = Path(cfg["log_dir"]) if cfg.get("log_dir") else None
        self.log_name = f"{os.getpid()}-{id(self):x}"
        self.best: dict[str, tuple[float, dict]] = {}

    @property
    def env(self):
        return self.envs[self.index]

    def mask(self) -> np.ndarray:
        m = np.zeros(self.n, np.float32)
        if self.env.schedule_space.knobs:
            m[: self.sizes[self.index]] = self.env.schedule_space.mask(self.env.schedule)
        else:
            m[0] = 1.0  # no knobs: the one move re-evaluates the current schedule
        return m

    def _obs(self, inner: Mapping[str, np.ndarray]) -> np.ndarray:
        onehot = np.zeros(self.n, np.float32)
        space = self.env.schedule_space
        if space.knobs:
            offsets = np.concatenate([[0], np.cumsum(space.nvec)[:-1]])
            onehot[offsets + np.asarray(inner["schedule"])] = 1.0
        who = np.zeros(len(self.names), np.float32)
        who[self.index] = 1.0
        scalars = [inner["last_speedup"][0], inner["best_speedup"][0], inner["last_correct"][0],
                   inner["step"][0] / max(self.env.max_steps, 1)]
        flat = np.concatenate([inner["features"], onehot, np.asarray(scalars, np.float32), who, self.mask()])
        return np.clip(flat, -OBS_LIMIT, OBS_LIMIT).astype(np.float32)

    def move(self, action: int) -> dict:
        """The schedule that move ``action`` leads to from the current one."""
        space = self.env.schedule_space
        schedule = dict(self.env.schedule)
        if not space.knobs:
            return schedule
        offsets = np.cumsum(space.nvec)
        knob = int(np.searchsorted(offsets, action, side="right"))
        value = action - (offsets[knob - 1] if knob else 0)
        schedule[space.knobs[knob].name] = space.knobs[knob].values[value]
        return schedule

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position = (self.position + 1) % len(self.cycle)
        self.index = self.cycle[self.position]
        inner, info = self.env.reset(seed=seed)
        self._record_best(info)
        return self._obs(inner), {**info, "workload": self.names[self.index]}

    def step(self, action):
        from policies.base import schedule_action

        action = int(action)
        allowed = 0 <= action < self.n and bool(self.mask()[action])
        if allowed:
            inner, reward, terminated, truncated, info = self.env.step(schedule_action(self.env, self.move(action)))
        else:  # never sampled under the mask; a caller without it gets the inner env's penalty for
            # an action outside its space (nothing is compiled or run)
            outside = np.full(len(self.env.schedule_space.knobs), -1)
            inner, reward, terminated, truncated, info = self.env.step(outside)
            info = {**info, "error": f"move {action} is masked out here"}
        self._record_best(info)
        self._log("steps", {"workload": self.names[self.index], "action": action, "allowed": allowed,
                            "speedup": info.get("speedup"), "correct": info.get("correct")})
        return self._obs(inner), float(reward), terminated, truncated, {**info, "workload": self.names[self.index]}

    def _record_best(self, info: Mapping) -> None:
        s, name = info.get("speedup"), self.names[self.index]
        if s is not None and s > self.best.get(name, (0.0, {}))[0]:
            self.best[name] = (float(s), dict(info.get("schedule") or self.env.schedule))
            self._log("best", {"workload": name, "speedup": float(s), "schedule": self.best[name][1]})

    def _log(self, kind: str, record: dict) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{kind}-{self.log_name}.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def close(self):
        for e in self.envs:
            e.close()


def read_log(log_dir: str | os.PathLike, kind: str) -> list[dict]:
    """Every record of one kind ("steps" or "best") the envs of a run wrote."""
    out = []
    for path in sorted(Path(log_dir).glob(f"{kind}-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def best_per_workload(log_dir) -> dict:
    best: dict = {}
    for r in read_log(log_dir, "best"):
        if r["speedup"] > best.get(r["workload"], {}).get("speedup", 0.0):
            best[r["workload"]] = {"speedup": r["speedup"], "schedule": r["schedule"]}
    return best


def masked_module_class():
    """PPO's default torch RLModule with the move mask (the observation's last ``n`` entries)
    applied to its logits: a masked move gets probability ~0 and is never sampled."""
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.torch_utils import FLOAT_MIN
    import torch

    class MaskedPPOModule(DefaultPPOTorchRLModule):
        def _masked(self, batch, out):
            mask = batch[Columns.OBS][..., -self.action_space.n:]
            out[Columns.ACTION_DIST_INPUTS] = out[Columns.ACTION_DIST_INPUTS] + torch.clamp(torch.log(mask),
                                                                                            min=FLOAT_MIN)
            return out

        def _forward(self, batch, **kwargs):
            return self._masked(batch, super()._forward(batch, **kwargs))

        def _forward_train(self, batch, **kwargs):
            return self._masked(batch, super()._forward_train(batch, **kwargs))

    return MaskedPPOModule


ENV_NAME = "jaxbench_knob_moves"


def ppo_config(workloads: Sequence[str], configs: Mapping[str, dict] | None = None, backend: str = "sim",
               cache_dir: str | None = None, log_dir: str | None = None, max_steps: int = 8,
               train_batch_size: int = 32, minibatch_size: int = 16, envs_per_runner: int | None = None,
               env_runners: int = 0, hidden: Sequence[int] = (64, 64), seed: int = 0):
    """A PPOConfig (new API stack) training one masked policy on ``workloads``; each env runner
    steps ``envs_per_runner`` sub-envs (default: one per workload, each starting on its own)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    register_env(ENV_NAME, lambda cfg: KnobMoveEnv(cfg))
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(ENV_NAME, env_config={"workloads": list(workloads), "configs": dict(configs or {}),
                                           "backend": backend, "cache_dir": cache_dir, "log_dir": log_dir,
                                           "max_steps": max_steps})
        .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=envs_per_runner or len(workloads),
                     rollout_fragment_length="auto")
        .training(train_batch_size=train_batch_size, minibatch_size=minibatch_size, num_epochs=2, lr=3e-4)
        .learners(num_learners=0)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=masked_module_class(),
                                               model_config={"fcnet_hiddens": list(hidden)}))
        .debugging(seed=seed)
    )


def train(workloads: Sequence[str], iters: int, out: str | os.PathLike, **kwargs) -> dict:
    """Train for ``iters`` iterations; writes ``learning_curve.csv``/``.png`` and ``best.json``
    under ``out`` (the envs' step logs under ``out/log``) and returns the curve and the bests."""
    import ray

    out = Path(out)
    log_dir = out / "log"
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, num_cpus=max(2, kwargs.get("env_runners", 0) + 1), log_to_driver=False)
    algo = ppo_config(workloads, log_dir=str(log_dir), **kwargs).build_algo()
    curve = []
    try:
        for i in range(1, iters + 1):
            result = algo.train()
            runners = result.get("env_runners", {})
            best = best_per_workload(log_dir)
            curve.append({"iteration": i, "env_steps": runners.get("num_env_steps_sampled_lifetime"),
                          "episode_return_mean": runners.get("episode_return_mean"),
                          "best_geomean": _geomean([b["speedup"] for b in best.values()])})
    finally:
        algo.stop()
        if started:
            ray.shutdown()
    best = best_per_workload(log_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "learning_curve.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(curve[0]) if curve else ["iteration"])
        w.writeheader()
        w.writerows(curve)
    (out / "best.json").write_text(json.dumps(best, indent=1))
    _plot_curve(out / "learning_curve.png", curve)
    return {"curve": curve, "best": best}


def _geomean(xs):
    return float(np.exp(np.mean(np.log(xs)))) if xs else None


def _plot_curve(path: Path, curve: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [c["env_steps"] or 0 for c in curve]
    ax.plot(steps, [c["episode_return_mean"] if c["episode_return_mean"] is not None else np.nan for c in curve],
            marker="o", label="episode return (mean)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    twin = ax.twinx()
    twin.plot(steps, [c["best_geomean"] or np.nan for c in curve], color="tab:red", marker="s",
              label="best speedup so far (geomean over workloads)")
    twin.set_ylabel("best speedup")
    fig.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
