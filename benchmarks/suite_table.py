"""The suite table: several policies at equal steps over a set of workloads, with the experts.

Runs ``jaxbench bench`` (``jaxbench_env.suite``) once per policy on one result cache, each
resumable under ``--out/<policy>``, then prints one Markdown table: per workload the XLA
baseline, each policy's best speedup and the expert's; then each policy's suite figures
(geomean with no-correct counted 1.0x, fast_1, fast_1.5, correct rate). Times are predicted
by the v6e simulator (or measured, on a TPU backend).

    python benchmarks/suite_table.py [--policies random,greedy,beam,gradient] [--steps 8]
        [--workloads all] [--out runs/suite-table] [--ray-address auto | --workers N] [--timing-only]

With ``--timing-only`` each search explores unchecked (compile and simulate) and the three
fastest schedules it found are then checked in order; a policy's best is the first that passes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxbench_env import suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="random,greedy,beam,gradient")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workloads", default="all")
    ap.add_argument("--out", default="runs/suite-table")
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--ray-address")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--timing-only", action="store_true")
    args = ap.parse_args()
    names = suite.select(args.workloads)
    out = Path(args.out)
    cache = str(out / "cache")
    results = {}
    for policy in args.policies.split(","):
        spec = suite.BenchSpec(policy=policy, steps=args.steps, backend=args.backend, seed=0,
                               policy_kwargs={"seed": 0} if policy in ("random", "gradient") else {},
                               timing_only=args.timing_only)
        results[policy] = suite.bench(spec, names, out / policy, cache_dir=cache, ray_address=args.ray_address,
                                      workers=args.workers)
    policies = list(results)
    rows = {p: {r["workload"]: r for r in results[p]["rows"]} for p in policies}
    first = rows[policies[0]]
    source = ", ".join(results[policies[0]]["summary"]["timing_sources"])
    mode = ", explored timing-only, best checked" if args.timing_only else ""
    print(f"\nbest speedup over XLA within {args.steps} steps from the template's default ({source}{mode})\n")
    print("| workload | XLA ms | " + " | ".join(policies) + " | expert |")
    print("|---|---|" + "---|" * len(policies) + "---|")

    def fmt(x):
        return "-" if x is None else f"{x:.2f}x"

    for name in names:
        base = first[name].get("baseline_ms")
        cells = [fmt(rows[p][name].get("best_speedup")) if not rows[p][name].get("error") else "error"
                 for p in policies]
        expert = fmt(first[name].get("expert_speedup")) if "expert_ms" in first[name] else ""
        print(f"| {name} | {'-' if base is None else f'{base:.3f}'} | " + " | ".join(cells) + f" | {expert} |")
    # Timing-only proposals are not checked: their rate is of proposals that compiled and were priced.
    rate = "proposals priced (unchecked)" if args.timing_only else "correct rate"
    print(f"\n| policy | geomean | fast_1 | fast_1.5 | {rate} | workloads without a correct candidate |")
    print("|---|---|---|---|---|---|")
    for p in policies:
        f = results[p]["summary"]["policy"]
        print(f"| {p} | {f['geomean_speedup']:.3f}x | {f['fast_p']['1.0']:.2f} | {f['fast_p']['1.5']:.2f} | "
              f"{f['correct_rate']:.0%} | {f['without_correct']} |")
    e = results[policies[0]]["summary"].get("expert")
    if e:
        print(f"| experts ({e['workloads']} workloads) | {e['geomean_speedup']:.3f}x | {e['fast_p']['1.0']:.2f} | "
              f"{e['fast_p']['1.5']:.2f} | - | {e['without_correct']} |")


if __name__ == "__main__":
    main()
