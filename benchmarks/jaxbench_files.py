"""JAXBench's own files as candidates: every ``baseline.py`` should be judged correct at
1.00x (the XLA baseline is JAXBench's program) and every ``optimized.py`` accepted.

DIR holds one folder per workload whose name starts with its JAXBench id (``1p_...``,
``18k_...``), each with ``baseline.py`` and optionally ``optimized.py``: the layout of
JAXBench's ``benchmark/`` folder, so a clone of it can be passed as well as this project's
own JAXBench-format files (``tests/jaxbench_format``, the default; written here after
JAXBench's signatures and formulations). Each file goes through the same path as
``jaxbench evaluate NAME --kernel FILE``: sandboxed build, the judge's check and price.

    python benchmarks/jaxbench_files.py [DIR] [--ids 1p,18k,...] [--cache-dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
from pathlib import Path

from jaxbench_env.aot import prepare_process

prepare_process("sim")

import workloads  # noqa: E402
from jaxbench_env.candidate import Candidate  # noqa: E402
from jaxbench_env.evaluation import Evaluator  # noqa: E402

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "tests" / "jaxbench_format"
FILES = ("baseline.py", "optimized.py")
AT_PAR = 0.005  # |speedup - 1| under this is "at 1.00x"


def discover(root: Path) -> list[tuple[str, Path]]:
    """(workload name, file) for every baseline/optimized file under ``root``, in JAXBench's order."""
    by_id = {cls.jaxbench_id: name for name, cls in workloads.WORKLOADS.items()}
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        m = re.match(r"(\d+[pk])_", folder.name)
        if not m or m.group(1) not in by_id:
            continue
        found += [(by_id[m.group(1)], folder / f) for f in FILES if (folder / f).is_file()]
    order = list(workloads.WORKLOADS)
    return sorted(found, key=lambda nf: (order.index(nf[0]), nf[1].name))


def judge_file(ev: Evaluator, path: Path) -> dict:
    """Evaluate one file as a candidate and print its table row."""
    t0 = time.perf_counter()
    r = ev.evaluate(Candidate(path.read_text(), {}))
    wall = time.perf_counter() - t0
    shrunk = r.details.get("check_size") or {}
    row = {"id": ev.workload.jaxbench_id, "workload": ev.workload.name, "file": path.name, "correct": r.correct,
           "speedup": r.speedup, "time_ms": r.time_ms, "baseline_ms": r.baseline_ms, "checked_at": shrunk,
           "error": r.error.splitlines()[0][:160] if r.error else None, "wall_s": round(wall, 1), "cached": r.cached}
    speed = "-" if r.speedup is None else f"{r.speedup:.3f}x"
    at = ",".join(f"{k}={v}" for k, v in shrunk.items()) or "-"
    print(f"| {row['id']} | {row['workload']} | {path.name} | {r.correct} | {speed} | {at} | {wall:.0f} s | "
          f"{row['error'] or ''} |", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--ids", help="comma-separated JAXBench ids to run (default: all found)")
    ap.add_argument("--cache-dir")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    files = discover(args.dir)
    if args.ids:
        wanted = set(args.ids.split(","))
        files = [(n, f) for n, f in files if workloads.WORKLOADS[n].jaxbench_id in wanted]
    rows = []
    print("| id | workload | file | correct | speedup | checked at | wall | error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, group in itertools.groupby(files, key=lambda nf: nf[0]):
        ev = Evaluator(name, backend="sim", cache_dir=args.cache_dir)  # one baseline per workload
        try:
            for _, path in group:
                rows.append(judge_file(ev, path))
        finally:
            ev.close()
    base = [r for r in rows if r["file"] == "baseline.py"]
    opt = [r for r in rows if r["file"] == "optimized.py"]
    at_par = [r for r in base if r["correct"] and r["speedup"] is not None and abs(r["speedup"] - 1) < AT_PAR]
    print(f"\nbaselines correct at 1.00x: {len(at_par)}/{len(base)}; optimized files accepted: "
          f"{sum(bool(r['correct']) for r in opt)}/{len(opt)}")
    for r in base:
        if r not in at_par:
            print(f"  baseline not at par: {r['id']} {r['workload']}: correct={r['correct']} speedup={r['speedup']} {r['error'] or ''}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
