"""The v6e simulator's pricing, with the v5e chip table, against the Pallas TPU matmul guide's
published v5e times.

JAX's Pallas TPU matrix multiplication guide publishes times of its blocked matmul kernel
(a k-innermost grid with a float32 VMEM accumulator) on a TPU v5e: block sizes 128/128/128
and 512/1024/1024 at 1024^3, 4096^3 and 8192^3 in bf16, plain, with a transposed right-hand
side and with a fused ReLU, and XLA's matmul beside them
(``jaxbench_env/data/pallas_matmul_guide_v5e.csv``, source and revision in its header). This
compiles our equivalent kernel for each row for v5e (libtpu's AOT compiler, ``v5e:1x1``),
prices it with the V5E chip table and the v6e-fitted constants, and reports Spearman of
predicted vs measured (target >= 0.9) and the median absolute relative error (target
<= 20%) over the Pallas rows (XLA rows reported apart). Without a v5e compile target it
compiles for v6e and reports the rank correlation only. About 1-10 s per row.

    python benchmarks/matmul_guide_v5e.py [--chip v5e|v6e] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

from jaxbench_env.aot import prepare_process

prepare_process("sim")

from jaxbench_env import validation  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=("v5e", "v6e"), default="v5e", help="compile target and chip table")
    parser.add_argument("--json", metavar="PATH", help="save the results as JSON")
    args = parser.parse_args()

    t0 = time.perf_counter()
    summary = validation.run_matmul_guide(args.chip, progress=True)
    if summary["chip"] != "v5e":
        print(f"NOTE: compiled and priced for {summary['chip']}, not v5e: only the rank correlation means anything\n")
    print(validation.matmul_markdown(summary))
    print()
    print(validation.matmul_headline(summary) + f" [{time.perf_counter() - t0:.0f} s]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "source": str(validation.GUIDE_CSV), **summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
