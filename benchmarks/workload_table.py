"""The per-workload table: XLA baseline, template default and expert times, with wall times.

For each workload (all, or those named), with a fresh result cache: the XLA baseline, one
uncached evaluation of the template's default schedule (compile for v6e at full size, the
3-seed interpret check at check size, time) and, where the workload has one, its expert.
Prints a Markdown table. Times come from the backend ("v6e-sim": predicted); the wall
and check columns are measured on this machine.

    python benchmarks/workload_table.py [--backend sim] [--no-check] [NAME ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import workloads
from jaxbench_env.candidate import Candidate
from jaxbench_env.evaluation import Evaluator


def fmt(result) -> str:
    if result is None:
        return "-"
    if not result.ok:
        return f"FAILED ({(result.error or '').splitlines()[0][:60]})"
    timing_only = str(result.details.get("check", "")).startswith("not checked")
    unchecked = "" if result.correct is not None or timing_only else " (compile-checked only)"
    return f"{result.time_ms:.2f} ms ({result.speedup:.2f}x){unchecked}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workloads (default: all)")
    parser.add_argument("--backend", default="sim", choices=("sim", "tpu", "auto"))
    parser.add_argument("--no-check", action="store_true",
                        help="times only: skip the interpret check (the check columns print '-')")
    args = parser.parse_args()
    names = args.names or list(workloads.WORKLOADS)
    cache = tempfile.mkdtemp(prefix="jaxbench-table-")

    rows = []
    for name in names:
        ev = Evaluator(name, backend=args.backend, cache_dir=cache)
        try:
            base = ev.baseline()
            wl = ev.workload
            t0 = time.perf_counter()
            template = ev.evaluate(Candidate(wl.template_source(), wl.schedule_space().default()), check=not args.no_check)
            wall = time.perf_counter() - t0
            expert = ev.expert(check=not args.no_check) if wl.expert_file else None
        finally:
            ev.close()
        check_s = template.details.get("stage_s", {}).get("check")
        rows.append((name, wl.jaxbench_id, f"{base.time_ms:.2f} ms", fmt(template), fmt(expert),
                     "-" if check_s is None else f"{check_s:.1f} s", "-" if args.no_check else f"{wall:.1f} s"))
        print(f"# {name} done", flush=True)

    source = base.timing_source
    print(f"\ntimes: {source} ({'predicted' if source == 'v6e-sim' else 'measured'}); "
          "check and wall: measured on this machine\n")
    head = ("workload", "id", "XLA baseline", "template default", "expert", "3-seed check", "uncached evaluate")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
