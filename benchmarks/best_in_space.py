"""The best schedule in each template's space: what an agent acting on schedules can reach.

For each workload: ``jaxbench bench`` with the gradient policy in timing-only mode (compile
and simulate, no interpret check) from the template's default: the relaxed model's first
``--gradient`` proposals, then greedy refinement around the best (``local_moves``), ``--evals``
evaluations in all; then the fastest three schedules found are checked in order and the
first that passes is the workload's best. Prints per workload the XLA baseline, the
default's speedup, the best's, the expert's where one exists and the best schedule; then
geometric means per category (production, KernelBench matmul family, KernelBench conv
family) and overall, over workloads with a checked best (a workload without one counts
1.0x, the XLA fallback). ragged_paged_attention is left out of the means: its reference
loops over sequences, so its XLA baseline is not one JAXBench measured.

Times are the v6e simulator's predictions (or measurements on a TPU backend). Resumable:
a re-run with the same ``--out`` continues where it stopped.

    python benchmarks/best_in_space.py [--workloads all] [--evals 24] [--gradient 8]
                                       [--out runs/best-in-space] [--workers N | --ray-address auto]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxbench_env import suite

LEFT_OUT = ("ragged_paged_attention",)


def family(row: dict) -> str:
    import workloads

    cls = workloads.WORKLOADS[row["workload"]]
    if cls in workloads.PRODUCTION:
        return "production"
    return "KernelBench conv" if cls.__module__.endswith("conv_workloads") else "KernelBench matmul"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="all")
    ap.add_argument("--evals", type=int, default=24, help="evaluations per workload after the default's")
    ap.add_argument("--gradient", type=int, default=8, help="of which the relaxed model's proposals, at most")
    ap.add_argument("--out", default="runs/best-in-space")
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--ray-address")
    ap.add_argument("--workers", type=int)
    args = ap.parse_args()
    out = Path(args.out)
    spec = suite.BenchSpec(policy="gradient", steps=args.evals, backend=args.backend, seed=0, timing_only=True,
                           policy_kwargs={"seed": 0, "max_proposals": args.gradient})
    result = suite.bench(spec, suite.select(args.workloads), out, cache_dir=str(out / "cache"),
                         ray_address=args.ray_address, workers=args.workers)
    rows = result["rows"]
    source = ", ".join(result["summary"]["timing_sources"])

    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    print(f"\nbest schedule in the template's space: gradient ({args.gradient} proposals) + greedy, "
          f"{args.evals} timing-only evaluations, best checked ({source})\n")
    print("| workload | family | XLA ms | default | best in space | expert | best schedule |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("error"):
            print(f"| {r['workload']} | {family(r)} | - | - | error: {r['error'][:80]} | - | - |")
            continue
        sched = ", ".join(f"{k}={v}" for k, v in (r.get("best_schedule") or {}).items())
        failed = f" ({len(r['check_failures'])} failed the check)" if r.get("check_failures") else ""
        print(f"| {r['workload']} | {family(r)} | {r['baseline_ms']:.4f} | {x(r.get('start_speedup'))} | "
              f"{x(r.get('best_speedup'))}{failed} | {x(r.get('expert_speedup'))} | {sched} |")
    counted = [r for r in rows if not r.get("error") and r["workload"] not in LEFT_OUT]
    print(f"\ngeometric mean speedup over XLA ({', '.join(LEFT_OUT)} left out; no checked best = 1.0x)\n")
    print("| family | workloads | default | best in space | expert (its workloads) | best in space (same) |")
    print("|---|---|---|---|---|---|")
    for name in ("production", "KernelBench matmul", "KernelBench conv", "all"):
        group = [r for r in counted if name == "all" or family(r) == name]
        if not group:
            continue
        experts = [r for r in group if r.get("expert_speedup")]
        print(f"| {name} | {len(group)} | {x(suite.geomean(r.get('start_speedup') or 1.0 for r in group))} | "
              f"{x(suite.geomean(r.get('best_speedup') or 1.0 for r in group))} | "
              f"{x(suite.geomean(r['expert_speedup'] for r in experts))} | "
              f"{x(suite.geomean(r.get('best_speedup') or 1.0 for r in experts))} |")
    below = [r["workload"] for r in counted if (r.get("best_speedup") or 0) < 0.95]
    print(f"\nbelow 0.95x XLA: {len(below)} of {len(counted)}: {', '.join(below) or 'none'}")


if __name__ == "__main__":
    main()
