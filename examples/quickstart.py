"""Quickstart: make the gemm env, take a few random steps, then a few greedy ones.

    python examples/quickstart.py [--steps 3]

No TPU needed: times come from the v6e simulator (predicted); correctness is checked in
Pallas interpret mode. Results are cached ($JAXBENCH_CACHE_DIR or ~/.cache/jaxbench_gym),
so a second run is fast.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import jaxbench_env  # noqa: F401  (registers JAXBench/<workload>-v0)
from policies import GreedyPolicy, RandomPolicy, run_policy

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}


def show(rec):
    s = "FAILED" if rec["speedup"] is None else f"{rec['speedup']:.3f}x"
    print(f"  step {rec['step']}: {rec['schedule']} -> {s}" + (f" ({rec['error'][:60]})" if rec["error"] else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    env = gym.make("jaxbench_env:JAXBench/gemm-v0", action_mode="schedule", config=SMALL_GEMM)
    obs, info = env.reset(seed=0)
    word = "predicted" if info["timing_source"] == "v6e-sim" else "measured"
    print(f"gemm {SMALL_GEMM}: XLA baseline {info['baseline_ms']:.4f} ms ({word}), "
          f"template {info['time_ms']:.4f} ms, speedup {info['speedup']:.3f}x")
    print("observation keys:", sorted(obs))

    print("random policy (mask-respecting samples):")
    records = run_policy(RandomPolicy(seed=13), env, args.steps, seed=0, callback=show)
    print("greedy policy (local moves from the best schedule):")
    records += run_policy(GreedyPolicy(), env, args.steps, seed=0, callback=show)
    best = max((r for r in records if r["speedup"] is not None), key=lambda r: r["speedup"], default=None)
    if best is None or best["speedup"] < info["speedup"]:
        print(f"best over both phases: the template's default, {info['speedup']:.3f}x")
    else:
        print(f"best over both phases: {best['speedup']:.3f}x at {best['schedule']}")
    env.close()


if __name__ == "__main__":
    main()
