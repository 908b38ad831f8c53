"""Step latency of the gemm environment on the sim backend.

Prints the median latency of: a cached step, an uncached schedule step, and reset after
the first. Uses a fresh cache directory so "uncached" means uncached.

    python benchmarks/step_latency.py [--repeats N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import gymnasium as gym

import jaxbench_env  # noqa: F401


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = gym.make("JAXBench/gemm-v0", backend="sim", cache_dir=tempfile.mkdtemp(prefix="jaxbench-bench-"))
    first_reset, _ = timed(lambda: env.reset(seed=0))  # starts the worker, baseline, template
    space = env.unwrapped.schedule_space

    # Uncached: distinct valid schedules drawn at random (seeded). Interpret-mode checks
    # cost ~15-30 ms per grid step, so schedules with tiny blocks are the slow ones.
    valid = [s for s in space.all_schedules() if space.check(s) is None and s != space.default()]
    schedules = random.Random(args.seed).sample(valid, args.repeats)
    uncached = []
    for s in schedules:
        dt, (_, _, _, _, info) = timed(lambda s=s: env.step(space.encode(s)))
        assert not info["cached"], "expected an uncached step"
        uncached.append(dt)

    cached = []
    for s in schedules:
        dt, (_, _, _, _, info) = timed(lambda s=s: env.step(space.encode(s)))
        assert info["cached"]
        cached.append(dt)

    resets = [timed(lambda: env.reset(seed=0))[0] for _ in range(args.repeats)]
    env.close()

    print(f"gemm, sim backend, {args.repeats} repeats each (median; min-max)")
    print(f"first reset (worker start, baseline, template): {first_reset:.2f} s")
    for name, xs, unit, scale in (("cached step", cached, "ms", 1e3), ("uncached schedule step", uncached, "s", 1),
                                  ("reset after the first", resets, "ms", 1e3)):
        print(f"{name:>24}: {statistics.median(xs) * scale:8.2f} {unit}  ({min(xs) * scale:.2f}-{max(xs) * scale:.2f})")


if __name__ == "__main__":
    main()
