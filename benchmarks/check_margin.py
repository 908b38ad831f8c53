"""How close a template schedule's output comes to the check's tolerance, seed by seed.

The check passes an output when every value is within atol + rtol * |target| of its target
(``judge.expected``: for bf16 workloads the float32 reference, the tolerance widened until the
bf16 reference is within half of it). This builds the schedule's check-size program as the
judge does, runs it in interpret mode on ``make_inputs`` seeds, and prints the worst value's
share of its tolerance (1.0 fails), next to the bf16 reference's own: a schedule near 1.0
passes or fails by the draw of the check's secret seeds.

    python benchmarks/check_margin.py convtranspose3d_layernorm_gelu_scaling --schedule layout=ncdhw --seeds 2-7
"""
from __future__ import annotations

import argparse

import numpy as np

import workloads
from jaxbench_env import candidate_process, judge
from jaxbench_env.cli import parse_pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--schedule", default="", help="knobs over the default, as `jaxbench evaluate` takes them")
    ap.add_argument("--seeds", default="1-6", help="make_inputs seeds, FIRST-LAST")
    args = ap.parse_args()
    first, last = map(int, args.seeds.split("-"))
    wl = workloads.get(args.workload)
    request = {"workload": wl.name, "config": wl.config, "source": wl.template_source(),
               "schedule": parse_pairs(args.schedule, "--schedule"), "backend": "sim", "min_rung": 0}
    manifest, blobs = candidate_process.build_artifacts(request)
    if manifest["error"]:
        raise SystemExit(manifest["error"])
    programs, check_config, *_ = judge.verify_request(wl, {**request, "artifacts": blobs, "rung": manifest["rung"]})
    print(f"{wl.name} {args.schedule or '(default)'} at rung {manifest['rung']}: share of the tolerance used")
    for seed in range(first, last + 1):
        e = judge.expected(wl, check_config, seed)
        out = np.asarray(programs["check_cpu"].call(*e.inputs), np.float32)
        print(f"  seed {seed}: {judge._tolerance_used(out, e.target, e.atol, e.rtol):.2f} "
              f"(bf16 reference {judge._tolerance_used(e.ref, e.target, e.atol, e.rtol):.2f}, atol {e.atol:.3g})",
              flush=True)


if __name__ == "__main__":
    main()
