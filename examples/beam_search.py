"""Beam search over gemm schedules on fork()s of one env (a child must beat its parent).

    python examples/beam_search.py [--beam-width 4] [--depth 2] [--expand 4]
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import jaxbench_env  # noqa: F401
from policies import beam_search

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--expand", type=int, default=4, help="moves tried per beam node (nearest values first)")
    args = ap.parse_args()

    env = gym.make("jaxbench_env:JAXBench/gemm-v0", action_mode="schedule", config=SMALL_GEMM)
    _, info = env.reset(seed=0)
    print(f"start: {info['schedule']} -> {info['speedup']:.3f}x")

    def show(schedule, speedup):
        print(f"  tried {schedule} -> {'FAILED' if speedup is None else f'{speedup:.3f}x'}")

    schedule, speedup = beam_search(env, beam_width=args.beam_width, depth=args.depth, expand=args.expand,
                                    callback=show)
    word = "predicted" if info["timing_source"] == "v6e-sim" else "measured"
    print(f"best: {schedule} -> {speedup:.3f}x ({word})")
    env.close()


if __name__ == "__main__":
    main()
