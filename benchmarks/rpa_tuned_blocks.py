"""Does the v6e simulator rank jax's tuned ragged-paged-attention block sizes near the top?

jax ships ``TUNED_BLOCK_SIZES['TPU v6']`` (ragged_paged_attention/tuned_block_sizes.py): per
shape, the (num_kv_pages_per_block, num_queries_per_block) measured fastest on a real v6e.
For a deterministic sample of bf16 shapes spread over the table, this compiles jax's kernel
for v6e at every legal pair (the table's ranges: 4-16 KV pages x 32-256 queries, within
pages_per_seq and VMEM), on the batch the table was tuned on (34 decodes and one long
sequence, every KV length max_model_len: ``jaxbench_env.validation.rpa_batch``), prices each with the
simulator as the judge does (concrete scalar-prefetch tables, the physical floor), and
reports in what fraction of shapes the tuned pair is predicted within 10% of the best legal
pair (target: >= 80% of >= 20 shapes); the same on the model's own times (before the
floor, which ties pairs), and a diagnostic that prices the compiled kernel's loops with the
batch's trip counts. A pair that fails to compile is skipped and counted.

A shape has 4-12 pairs; a compile takes 1-10 s, but minutes for many query heads with large
query blocks (28 heads: 40-250 s at 128-256 queries): 20 shapes are about 160 compiles and
over 40 minutes on two busy cores. ``--budget-minutes`` starts no compile after that long
(a shape cut short is not scored).

    python benchmarks/rpa_tuned_blocks.py [--shapes 20] [--seed 0] [--max-pairs N]
                                          [--budget-minutes M] [--json PATH]

With ``--json PATH`` a run cut short by its budget continues where it stopped when run again.
``--reprice PATH`` scores such a saved sweep again with today's pricing and constants, from
the program features it saved, without compiling (to try a change to ``sim/model.py``'s price).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from jaxbench_env.aot import prepare_process

prepare_process("sim")

from jaxbench_env import validation  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=20, help="shapes sampled from the tuned table (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (and the page shuffle's)")
    parser.add_argument("--max-pairs", type=int, default=None,
                        help="pairs per shape at most: the tuned pair and its nearest neighbours (default: all)")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="start no compile after this many minutes (a shape cut short is not scored; listed)")
    parser.add_argument("--json", metavar="PATH",
                        help="save the results as JSON (rewritten after every shape); a run with the same "
                             "PATH, seed and simulator resumes: pairs already priced there are not compiled again")
    parser.add_argument("--reprice", metavar="PATH",
                        help="score the sweep saved at PATH again with today's price and constants (no compile)")
    args = parser.parse_args()
    if args.reprice:
        summary = validation.reprice_rpa(json.loads(Path(args.reprice).read_text()))
        print(validation.rpa_markdown(summary))
        print()
        print(validation.rpa_headline(summary) + f" [re-priced from {args.reprice}]")
        return 0
    state = {"simulator": validation.simulator_state(), "batch": validation.rpa_batch.__doc__, "seed": args.seed}
    pairs: dict = {}
    if args.json and Path(args.json).is_file():
        saved = json.loads(Path(args.json).read_text())
        if all(saved.get(k) == v for k, v in state.items()):
            pairs = saved.get("pairs", {})
            print(f"# resuming {args.json}: {len(pairs)} pairs already priced", flush=True)

    def save(summary):
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), **state, **summary, "pairs": pairs}, f, indent=1)

    t0 = time.perf_counter()
    budget = args.budget_minutes * 60 if args.budget_minutes is not None else None
    summary = validation.run_rpa(args.shapes, args.seed, args.max_pairs, progress=True, budget_s=budget,
                                 on_shape=save, pair_cache=pairs)
    print(validation.rpa_markdown(summary))
    print()
    print(validation.rpa_headline(summary)
          + f" [{summary['compiles']} compiles, {time.perf_counter() - t0:.0f} s]")
    save(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
