"""Step latency of the gemm environment on the sim backend, and what the sandbox costs.

Prints, from one run on one machine (medians; min-max):
- a cached step, and a reset after the first;
- an uncached schedule step through the whole sandboxed path (a fresh isolated process
  traces and exports the candidate, the judge verifies, compiles, checks and prices), with
  its stages;
- the same candidates' stages called directly in this one trusted process (trace at two
  sizes, compile, interpret-mode check, price), and the sandbox's overhead over that.

Uses a fresh cache directory so "uncached" means uncached.

    python benchmarks/step_latency.py [--repeats N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

from jaxbench_env.aot import prepare_process

prepare_process("sim")

import gymnasium as gym  # noqa: E402

import jaxbench_env  # noqa: E402,F401
from jaxbench_env import candidate_process, judge  # noqa: E402
from jaxbench_env.candidate import Candidate  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def direct_stages(wl, source: str, schedule: dict, rung: int) -> dict:
    """The stages of one evaluation called directly (checked at check rung ``rung``), no
    sandbox, no export, no judge."""
    import jax
    from jax.extend import core as jex_core

    from jaxbench_env.aot import compile_for_v6e
    from jaxbench_env.sim import V6E, bundles, predict_program

    out = {}
    t0 = time.perf_counter()
    module = candidate_process.load_module(source, wl.config, schedule)
    candidate_process.trace(module.workload, candidate_process.input_specs(wl, wl.config))
    check_config = wl.check_rungs()[rung]
    module.CONFIG = dict(check_config)
    check, _ = candidate_process.trace(module.workload, candidate_process.input_specs(wl, check_config))
    out["trace"] = time.perf_counter() - t0
    module.CONFIG = dict(wl.config)
    bundles.collect()
    out["compile"], (_, compiled) = timed(lambda: compile_for_v6e(module.workload,
                                                                   candidate_process.input_specs(wl, wl.config)))
    profiles = bundles.collect()
    interpreted = candidate_process.wrap_kernels(check, True)
    run = jax.jit(jex_core.jaxpr_as_fun(interpreted))

    def check_all():
        for seed in judge.SECRET_SEEDS:
            jax.block_until_ready(run(*judge.expected(wl, check_config, seed).inputs))

    out["check"], _ = timed(check_all)
    out["time"], _ = timed(lambda: predict_program(compiled, V6E, profiles))
    return out


def show(name: str, xs, unit: str = "s", scale: float = 1.0) -> None:
    print(f"{name:>34}: {statistics.median(xs) * scale:9.3f} {unit}  ({min(xs) * scale:.3f}-{max(xs) * scale:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = gym.make("JAXBench/gemm-v0", backend="sim", cache_dir=tempfile.mkdtemp(prefix="jaxbench-bench-"))
    u = env.unwrapped
    zygote_s, _ = timed(u.evaluator.sandbox.start)
    first_reset, _ = timed(lambda: env.reset(seed=0))  # starts the judge, baseline, template
    space = u.schedule_space
    # Schedules with 128-wide blocks have many grid steps to interpret: leave them out of a latency figure.
    valid = [s for s in space.all_schedules()
             if space.check(s) is None and s != space.default() and min(s["block_m"], s["block_k"]) >= 256]
    schedules = random.Random(args.seed).sample(valid, args.repeats)

    sandboxed, stages, direct = [], [], []
    for s in schedules:
        dt, (_, _, _, _, info) = timed(lambda s=s: env.step(space.encode(s)))
        assert not info["cached"] and info["correct"], info["error"]
        sandboxed.append(dt)
        details = u.evaluator.evaluate(Candidate(u.source, s)).details
        stages.append(details["stage_s"])
        d = direct_stages(u.workload, u.workload.template_source(), s, details["check_rung"])
        direct.append(d)

    cached = []
    for s in schedules:
        dt, (_, _, _, _, info) = timed(lambda s=s: env.step(space.encode(s)))
        assert info["cached"]
        cached.append(dt)
    resets = [timed(lambda: env.reset(seed=0))[0] for _ in range(args.repeats)]
    env.close()

    print(f"gemm at full size, sim backend, {args.repeats} uncached schedules (median; min-max)")
    print(f"sandbox start (import jax, v6e topology, trace warm-up): {zygote_s:.2f} s")
    print(f"first reset (judge start, baseline, template): {first_reset:.2f} s")
    show("cached step", cached, "ms", 1e3)
    show("reset after the first", resets, "ms", 1e3)
    print("sandboxed path, per uncached step:")
    show("whole step", sandboxed)
    forked = [st["sandbox"] - st.get("trace", 0) - st.get("export", 0) for st in stages]
    show("fork, isolation, result transfer", forked)
    for key in ("trace", "export", "verify", "compile", "check", "time"):
        show(f"{key}{' (judge: read, compare programs)' if key == 'verify' else ''}", [st.get(key, 0.0) for st in stages])
    print("direct, one trusted process, same candidates:")
    totals = [sum(d.values()) for d in direct]
    show("whole evaluation", totals)
    for key in ("trace", "compile", "check", "time"):
        show(key, [d[key] for d in direct])
    overhead = [(a - b) / b for a, b in zip(sandboxed, totals)]
    print(f"sandbox overhead over direct: median {statistics.median(overhead):+.0%} "
          f"(per step: {', '.join(f'{o:+.0%}' for o in overhead)})")


if __name__ == "__main__":
    main()
