"""How often the judge's comparison of sizes finds unseen work, over draws of the check's seeds.

The check's seeds are drawn afresh in each judge process, so what a template's kernels do on
the check's inputs varies from process to process where their control flow depends on the
inputs (page tables, group sizes). A finding at a rung below the last climbs the ladder; at
the last it bounds the price or rejects the candidate. This runs ``judge.unseen_control``
for a workload's default schedule (or ``--schedule``) at every rung it builds at, ``--draws``
times with fresh seeds, and prints how often each finding appeared and how often it left
work no bound prices (``judge.unbounded_unseen``).

    python benchmarks/unseen_draws.py ragged_paged_attention --draws 30
"""
from __future__ import annotations

import argparse
import collections
import os

import workloads
from jaxbench_env import candidate_process, judge
from jaxbench_env.cli import parse_pairs


def draw_seeds() -> tuple:
    """Secret seeds as a judge process draws them."""
    return tuple(1000 + int.from_bytes(os.urandom(4), "little") % 2**30 for _ in judge.SECRET_SEEDS)


def findings(unseen: list) -> list:
    """Each finding of ``unseen_control`` as (kernel, what)."""
    out = []
    for k, found in enumerate(unseen):
        out += [(k, f"item {i}") for i in found.items] + [(k, f"grid axis {a}") for a in found.grid]
        out += [(k, str(key)) for key in found.decisions] + [(k, f"input {w} short") for w in found.short]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--schedule", default="", help="knobs over the default, as `jaxbench evaluate` takes them")
    ap.add_argument("--draws", type=int, default=30)
    args = ap.parse_args()
    wl = workloads.get(args.workload)
    request = {"workload": wl.name, "config": wl.config, "source": wl.template_source(),
               "schedule": parse_pairs(args.schedule, "--schedule"), "backend": "sim"}
    last = len(wl.check_rungs()) - 1
    for rung in range(last + 1):
        manifest, blobs = candidate_process.build_artifacts({**request, "min_rung": rung})
        if manifest["error"] or manifest["rung"] != rung:
            print(f"rung {rung}/{last}: not built there ({manifest['error'] or 'built at rung %d' % manifest['rung']})")
            continue
        try:
            programs, check_config, _, aligned = judge.verify_request(wl, {**request, "artifacts": blobs,
                                                                           "rung": rung})
        except judge.SizeBoundary as e:
            print(f"rung {rung}/{last}: climbs before any comparison ({str(e)[:120]})")
            continue
        full = programs["full_tpu"]
        tables = judge.full_size_tables(wl, full)
        counts: collections.Counter = collections.Counter()
        unbounded = 0
        spec = (judge.SPEC_SEED,) if judge.SPEC_SEED in judge.check_seeds(full) else ()
        for _ in range(args.draws):
            unseen = judge.unseen_control(wl, full, tables, programs["check_tpu"], check_config, aligned,
                                          draw_seeds() + spec)
            counts.update(findings(unseen))
            unbounded += judge.unbounded_unseen(full, unseen) is not None
        seen = ", ".join(f"kernel {k} {what}: {n}" for (k, what), n in sorted(counts.items())) or "nothing"
        print(f"rung {rung}/{last}: over {args.draws} draws, {seen}; no bound for {unbounded}", flush=True)


if __name__ == "__main__":
    main()
