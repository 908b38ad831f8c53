"""PPO (RLlib, new API stack) trains one masked policy on several workloads' schedules.

    python examples/rllib_ppo.py [--workloads gemm,rmsnorm] [--iters 4] [--out runs/ppo] [--tiny]

Actions are single-knob moves whose mask is exact (``jaxbench_env.rllib.KnobMoveEnv``):
masked-out moves are never sampled. Writes the learning curve (CSV and PNG) and the best
schedule found per workload under ``--out``. ``--tiny`` shrinks gemm and rmsnorm so every
evaluation takes a second or two; the default is each workload's full size.
"""

from __future__ import annotations

import argparse

TINY = {"gemm": {"M": 256, "K": 256, "N": 256}, "rmsnorm": {"batch": 1, "seq_len": 256, "emb_dim": 1024}}


def main():
    from jaxbench_env import rllib

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="gemm,rmsnorm")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--out", default="runs/ppo")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--max-steps", type=int, default=8, help="steps per episode")
    ap.add_argument("--tiny", action="store_true", help="gemm and rmsnorm at tiny sizes")
    args = ap.parse_args()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    result = rllib.train(names, args.iters, args.out, configs=TINY if args.tiny else None,
                         cache_dir=args.cache_dir, max_steps=args.max_steps)
    for row in result["curve"]:
        print(f"iter {row['iteration']}: env steps {row['env_steps']}, episode return mean "
              f"{row['episode_return_mean']}, best speedup geomean {row['best_geomean']}")
    for name, best in result["best"].items():
        print(f"{name}: best {best['speedup']:.3f}x at {best['schedule']}")
    print(f"wrote {args.out}/learning_curve.csv, learning_curve.png and best.json")


if __name__ == "__main__":
    main()
