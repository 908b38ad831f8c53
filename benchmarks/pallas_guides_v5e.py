"""The v6e simulator's pricing, with the v5e chip table, against the Pallas TPU guides'
published v5e times.

JAX's Pallas TPU matrix multiplication guide publishes times of its blocked matmul kernel
(a k-innermost grid with a float32 VMEM accumulator) on a TPU v5e: block sizes 128/128/128
and 512/1024/1024 at 1024^3, 4096^3 and 8192^3 in bf16, plain, with a transposed right-hand
side and with a fused ReLU, and XLA's matmul beside them
(``jaxbench_env/data/pallas_matmul_guide_v5e.csv``). Its scalar-prefetch guide publishes
times of two block-sparse kernels at 16384^3 (a sparse left operand whose grid walks only
its 86 nonzero blocks; a lower-triangular output mask whose skipped blocks branch past the
matmul) and their XLA references (``jaxbench_env/data/pallas_sparse_guide_v5e.csv``).
Sources and revisions are in the files' headers. This compiles our equivalent of each
row's program for v5e (libtpu's AOT compiler, ``v5e:1x1``), prices it with the V5E chip
table and the v6e-fitted constants (scalar-prefetch tables evaluated on the row's block
pattern), and reports for the matmul guide Spearman of predicted vs measured (target >=
0.9) and the median absolute relative error (target <= 20%) over its Pallas rows, and for
the sparse guide each row's predicted/measured. Without a v5e compile target it compiles
for v6e and reports the rank correlation only. About 1-10 s per row.

    python benchmarks/pallas_guides_v5e.py [--chip v5e|v6e] [--guides matmul,sparse] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

from jaxbench_env.aot import prepare_process

prepare_process("sim")

from jaxbench_env import validation  # noqa: E402

GUIDES = {
    "matmul": (validation.run_matmul_guide, validation.matmul_markdown, validation.matmul_headline,
               validation.GUIDE_CSV),
    "sparse": (validation.run_sparse_guide, validation.sparse_markdown, validation.sparse_headline,
               validation.SPARSE_GUIDE_CSV),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=("v5e", "v6e"), default="v5e", help="compile target and chip table")
    parser.add_argument("--guides", default="matmul,sparse", help="which guides' rows (default both)")
    parser.add_argument("--json", metavar="PATH", help="save the results as JSON")
    args = parser.parse_args()

    saved = {"args": vars(args)}
    for name in args.guides.split(","):
        run, markdown, headline, source = GUIDES[name]
        t0 = time.perf_counter()
        summary = run(args.chip, progress=True)
        if summary["chip"] != "v5e":
            print(f"NOTE: compiled and priced for {summary['chip']}, not v5e: only the rank correlation means anything\n")
        print(markdown(summary))
        print()
        print(headline(summary) + f" [{time.perf_counter() - t0:.0f} s]")
        print()
        saved[name] = {"source": str(source), **summary}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(saved, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
