"""How long the simulator's own work takes per candidate, apart from compiling.

For each workload (default: a spread of kernels and grids), one uncached evaluation of
the template's default schedule without the interpret check, on a fresh cache. Prints the
compile stage and the time stage (reading bundles and HLO, the per-step model, scalar-
prefetch tables, pricing) with their medians.

    python benchmarks/sim_speed.py [NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import workloads
from jaxbench_env.candidate import Candidate
from jaxbench_env.evaluation import Evaluator

DEFAULT = ("gemm", "rmsnorm", "flash_attention", "paged_attention", "megablox_gmm", "mixtral_moe",
           "matmul_gelu_softmax", "conv3d_mish_tanh")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    names = parser.parse_args().names or list(DEFAULT)
    cache = tempfile.mkdtemp(prefix="jaxbench-simspeed-")
    rows = []
    for name in names:
        ev = Evaluator(name, backend="sim", cache_dir=cache)
        try:
            wl = ev.workload
            r = ev.evaluate(Candidate(wl.template_source(), wl.schedule_space().default()), check=False)
        finally:
            ev.close()
        stages = r.details.get("stage_s", {})
        steps = sum(k["steps"] for k in (r.details.get("sim") or {}).get("kernels", []))
        rows.append((name, stages.get("compile"), stages.get("time"), steps, r.error))
        print(f"# {name} done", flush=True)
    print("\n| workload | grid steps | compile (s) | simulator (s) |\n|---|---|---|---|")
    for name, compile_s, sim_s, steps, error in rows:
        if error:
            print(f"| {name} | - | - | FAILED: {error.splitlines()[0][:60]} |")
        else:
            print(f"| {name} | {steps} | {compile_s:.2f} | {sim_s:.3f} |")
    sims = [r[2] for r in rows if r[2] is not None]
    print(f"\nsimulator work per candidate: median {statistics.median(sims):.3f} s, max {max(sims):.3f} s "
          f"({len(sims)} workloads)")


if __name__ == "__main__":
    main()
