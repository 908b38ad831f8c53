"""How much of the check's tolerance rounding alone uses, per workload, over random seeds.

For each workload's template (and expert, where it has one) at the check size the judge
uses (the first rung where the programs are one program), over N random seeds, the max of
|out - target| / (atol + rtol |target|), 1 being the edge of allclose, for three pairs:

- the kernel against the bf16 reference,
- the kernel against the reference computed in float32 on the same inputs,
- the bf16 reference against that float32 computation: the reference's own rounding.

A bf16 reference whose own error nears 1 fails correct kernels at random when it is the
target; the judge compares with float32 instead (``judge.expected``). The kernels are built
as the sandbox builds them and run as the judge runs them, in-process (they are trusted).

    python benchmarks/check_noise.py [--seeds 12] [--workloads production|NAME,...]
"""

from __future__ import annotations

import argparse

from jaxbench_env.aot import prepare_process

prepare_process("sim")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import workloads  # noqa: E402
from jaxbench_env import candidate_process, judge  # noqa: E402
from jaxbench_env.evaluation import climb_ladder  # noqa: E402


def check_program(wl, source: str):
    """The candidate's interpret-mode program and config at the first rung the judge accepts."""
    def at(min_rung):
        request = {"workload": wl.name, "config": wl.config, "source": source, "schedule": {}, "backend": "sim",
                   "min_rung": min_rung}
        manifest, blobs = candidate_process.build_artifacts(request)
        if manifest["error"]:
            return {"error": manifest["error"], "details": {}}
        details = {"check_rung": manifest["rung"]}
        try:
            programs, config, *_ = judge.verify_request(wl, {**request, "artifacts": blobs, "rung": manifest["rung"]})
        except judge.Rejected as e:
            return {"error": str(e), "details": {**details, "size_boundary": isinstance(e, judge.SizeBoundary)}}
        return {"error": None, "details": details, "built": (programs["check_cpu"], config)}

    answer = climb_ladder(len(wl.check_rungs()), at)
    if answer["error"]:
        raise RuntimeError(answer["error"])
    return answer["built"]


def used(outs, targets, atol, rtol) -> float:
    return max(float(np.max(np.abs(o - t) / (atol + rtol * np.abs(t)))) for o, t in zip(outs, targets))


def leaves(tree):
    return [np.asarray(x, np.float32) for x in jax.tree_util.tree_leaves(tree)]


def measure(wl, source: str, seeds) -> np.ndarray:
    program, config = check_program(wl, source)
    run = jax.jit(program.call)
    ref = jax.jit(lambda *a: wl.reference(config, *a))
    ref32 = jax.jit(lambda *a: wl.reference({**config, "dtype": "float32"}, *a))
    atol, rtol = wl.tolerance(config)
    rows = []
    for seed in seeds:
        inputs = wl.make_inputs(config, seed)
        bf16 = leaves(ref(*inputs))
        upcast = [a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in inputs]
        f32 = leaves(ref32(*upcast))
        out = leaves(run(*inputs))
        rows.append((used(out, bf16, atol, rtol), used(out, f32, atol, rtol), used(bf16, f32, atol, rtol)))
    return np.array(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--workloads", default="production")
    args = ap.parse_args()
    names = ([cls.name for cls in workloads.PRODUCTION] if args.workloads == "production"
             else args.workloads.split(","))
    seeds = range(1000, 1000 + args.seeds)
    print(f"max over {args.seeds} seeds of the tolerance used (1 = the edge of allclose)")
    print(f"{'workload':26s} {'kernel':8s} {'vs bf16 ref':>12s} {'vs float32':>11s} {'ref vs float32':>15s}")
    for name in names:
        wl = workloads.get(name)
        kinds = [("template", wl.template_source())] + ([("expert", wl.expert_source())] if wl.expert_file else [])
        for kind, source in kinds:
            try:
                a = measure(wl, source, seeds).max(axis=0)
                print(f"{name:26s} {kind:8s} {a[0]:12.2f} {a[1]:11.2f} {a[2]:15.2f}", flush=True)
            except Exception as e:  # noqa: BLE001 - one workload's failure is a row, not the end
                print(f"{name:26s} {kind:8s} not measured: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
