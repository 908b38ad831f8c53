"""PPO (one masked policy, trained on some workloads) against random search on workloads it never saw.

PPO trains with ``jaxbench_env.rllib`` (single-knob moves, exact mask) on the training
workloads; the padded space and the workload one-hot cover the held-out ones too, which it
never steps on. Then, on each held-out workload, the trained policy (sampling its masked
action distribution, several seeds) and random search (uniformly random legal moves from the
same start, several seeds) each get the same number of evaluations; printed: the best
speedup each found (median over seeds), predicted by the v6e simulator.

    python benchmarks/rllib_vs_random.py [--train gemm,swiglu_mlp,cross_entropy]
        [--test gemm_add_relu,matmul_gelu_softmax,rmsnorm] [--iters 4] [--evals 8] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np


def rollout(env, name: str, evals: int, choose) -> float:
    """Best speedup over the start and ``evals`` moves chosen by ``choose(obs, mask)``."""
    env.cycle, env.position = [env.names.index(name)], -1  # reset to this workload
    obs, info = env.reset(seed=0)
    best = info["speedup"] or 0.0
    for _ in range(evals):
        obs, _, terminated, truncated, info = env.step(choose(obs, env.mask()))
        best = max(best, info["speedup"] or 0.0)
        if terminated or truncated:
            break
    return best


def main() -> None:
    import torch
    from ray.rllib.core.columns import Columns

    from jaxbench_env import rllib

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="gemm,swiglu_mlp,cross_entropy")
    ap.add_argument("--test", default="gemm_add_relu,matmul_gelu_softmax,rmsnorm")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--evals", type=int, default=8, help="evaluations per search on a held-out workload")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    train, test = args.train.split(","), args.test.split(",")
    out = tempfile.mkdtemp(prefix="jaxbench-ppo-")
    cache = f"{out}/cache"

    # The env lists every workload (one padded space, one identity per workload); training
    # resets cycle through the training ones only.
    import ray

    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)
    config = rllib.ppo_config(train, cache_dir=cache, log_dir=f"{out}/log", max_steps=args.evals,
                              envs_per_runner=1)
    env_config = dict(config.env_config, workloads=train + test, reset_workloads=train)
    config.environment(env_config=env_config)
    algo = config.build_algo()
    for i in range(args.iters):
        r = algo.train()
        print(f"# iteration {i + 1}: episode return mean {r['env_runners'].get('episode_return_mean')}", flush=True)
    module = algo.get_module()
    algo.stop()
    ray.shutdown()

    env = rllib.KnobMoveEnv({**env_config, "log_dir": None})
    rows = []
    for name in test:
        ppo, rand = [], []
        for seed in range(args.seeds):
            gen = torch.Generator().manual_seed(seed)

            def policy(obs, mask, gen=gen):
                with torch.no_grad():
                    logits = module.forward_inference({Columns.OBS: torch.as_tensor(obs[None])})[
                        Columns.ACTION_DIST_INPUTS][0]
                return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))

            rng = np.random.default_rng(seed)
            ppo.append(rollout(env, name, args.evals, policy))
            rand.append(rollout(env, name, args.evals, lambda obs, mask, rng=rng: int(rng.choice(np.flatnonzero(mask)))))
        rows.append((name, statistics.median(ppo), statistics.median(rand)))
        print(f"# {name} done", flush=True)
    env.close()
    print(f"\nbest predicted speedup over XLA within {args.evals} evaluations (median of {args.seeds} seeds; "
          f"PPO trained {args.iters} iterations on {args.train})\n")
    print(f"{'held-out workload':<32} {'PPO':>8} {'random':>8}")
    for name, p, r in rows:
        print(f"{name:<32} {p:>7.3f}x {r:>7.3f}x")
    g = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
    print(f"{'geomean':<32} {g([p for _, p, _ in rows]):>7.3f}x {g([r for *_, r in rows]):>7.3f}x")


if __name__ == "__main__":
    main()
