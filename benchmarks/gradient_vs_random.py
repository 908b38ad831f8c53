"""Gradient search on the relaxed model against random search, same simulator budget.

For each workload: the gradient policy's proposals (``policies.gradient``: Adam on the
simulator's differentiable tier from the template's default and random starts, rounded to
legal schedules) and uniformly random legal schedules (several seeds) are each given the
same number of full-simulator evaluations (v6e compile + simulator, no interpret check).
Prints the best predicted time each found, and the default schedule's, in one run.

    python benchmarks/gradient_vs_random.py [--budget 6] [--seeds 3] [NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import gymnasium as gym
import numpy as np

import jaxbench_env  # noqa: F401  (registers the environments)
from jaxbench_env.candidate import Candidate
from policies.gradient import GradientPolicy

DEFAULT = ("gemm", "swiglu_mlp", "matmul_gelu_softmax", "gemm_add_relu")


def best_ms(evaluator, source, schedules) -> float:
    times = [evaluator.evaluate(Candidate(source, s), check=False).time_ms for s in schedules]
    return min((t for t in times if t is not None), default=float("nan"))


def random_schedules(space, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    legal = [s for s in space.all_schedules() if space.check(s) is None]
    return [legal[i] for i in rng.choice(len(legal), size=min(n, len(legal)), replace=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--budget", type=int, default=6, help="simulator evaluations per search")
    parser.add_argument("--seeds", type=int, default=3, help="random-search seeds")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="jaxbench-gradient-")
    rows = []
    for name in args.names or DEFAULT:
        env = gym.make(f"JAXBench/{name}-v0", backend="sim", cache_dir=cache)
        env.reset(seed=0)
        u = env.unwrapped
        source, space, ev = u.source, u.schedule_space, u.evaluator
        default_ms = best_ms(ev, source, [u.schedule])
        policy = GradientPolicy(seed=0)
        proposals = policy.proposals(env)[:args.budget]
        grad_ms = best_ms(ev, source, proposals)
        rand = [best_ms(ev, source, random_schedules(space, args.budget, seed)) for seed in range(args.seeds)]
        rows.append((name, u.evaluator.baseline().time_ms, default_ms, grad_ms, len(proposals), rand))
        env.close()
        print(f"# {name} done", flush=True)
    print(f"\nbest predicted time (ms, v6e-sim) within {args.budget} simulator evaluations\n")
    print("| workload | XLA baseline | template default | gradient | random (median of seeds) | random seeds |")
    print("|---|---|---|---|---|---|")
    for name, base, default, grad, n, rand in rows:
        print(f"| {name} | {base:.3f} | {default:.3f} | {grad:.3f} ({n} proposals) | {statistics.median(rand):.3f} | "
              f"{', '.join(f'{r:.3f}' for r in rand)} |")


if __name__ == "__main__":
    main()
