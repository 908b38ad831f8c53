"""PPO (RLlib, new API stack) on the schedule-action gemm env, for 2 training iterations.

    python examples/rllib_ppo.py [--iters 2] [--cache-dir /tmp/jaxbench_cache] [--tiny]

The observation is a Dict, so the env-to-module pipeline flattens it
(``FlattenObservations``); the action is the MultiDiscrete schedule index vector. The
small gemm config keeps each uncached evaluation at seconds to ~30 s (random schedules with
128-wide blocks run many grid steps in the interpret check); repeats hit the cache.
``--tiny`` (M=K=N=256) makes every evaluation ~1-2 s: 2 iterations in well under a minute.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}
ENV_NAME = "jaxbench_gemm_small"


def make_env(env_config: dict | None = None):
    import jaxbench_env  # noqa: F401  (registers JAXBench/*-v0; runs in every env runner)

    cfg = dict(env_config or {})
    return gym.make("jaxbench_env:JAXBench/gemm-v0", action_mode="schedule",
                    config=cfg.pop("config", SMALL_GEMM), **cfg)


def build_config(cache_dir: str | None = None, max_steps: int = 8, train_batch_size: int = 16,
                 minibatch_size: int = 8, backend: str = "sim", config: dict | None = None):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.tune.registry import register_env

    register_env(ENV_NAME, make_env)
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(ENV_NAME, env_config={"config": dict(config or SMALL_GEMM), "max_steps": max_steps,
                                           "cache_dir": cache_dir, "backend": backend})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=train_batch_size,
                     env_to_module_connector=lambda env, spaces=None, device=None: FlattenObservations())
        .training(train_batch_size=train_batch_size, minibatch_size=minibatch_size, num_epochs=1, lr=3e-4)
        .learners(num_learners=0)
        .rl_module(model_config={"fcnet_hiddens": [32, 32]})
        .debugging(seed=0)
    )


def train(iters: int = 2, cache_dir: str | None = None, **kw) -> list[dict]:
    import ray

    ray.init(ignore_reinit_error=True, include_dashboard=False, num_cpus=2, log_to_driver=False)
    algo = build_config(cache_dir=cache_dir, **kw).build_algo()
    results = []
    try:
        for _ in range(iters):
            results.append(algo.train())
    finally:
        algo.stop()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--tiny", action="store_true", help="gemm at M=K=N=256 instead of the small config")
    args = ap.parse_args()
    config = {"M": 256, "K": 256, "N": 256} if args.tiny else SMALL_GEMM
    for i, r in enumerate(train(args.iters, args.cache_dir, config=config), 1):
        er = r.get("env_runners", {})
        print(f"iter {i}: env steps {er.get('num_env_steps_sampled_lifetime')}, "
              f"episodes {er.get('num_episodes_lifetime')}, "
              f"episode return mean {er.get('episode_return_mean')}")


if __name__ == "__main__":
    main()
