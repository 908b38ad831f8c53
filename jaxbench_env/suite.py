"""A policy over a set of workloads: the per-workload table, the suite's figures, its files.

``bench(spec, out)`` runs ``spec.policy`` for ``spec.steps`` steps on each selected
workload, each in an environment (and so an evaluator, a judge and a sandbox) of its own,
here or as Ray tasks, and writes under ``out``:

- ``workloads/NAME.json``: one workload's row and its step records, written when it
  finishes; a re-run with the same spec reuses it (and every evaluation it repeats is a
  result-cache hit), so an interrupted bench continues where it stopped;
- ``results.json`` (spec, suite figures, rows), ``results.csv`` (rows), ``results.png``
  (speedup per workload on a log axis with the expert marked, and fast_p over p).

The suite figures follow JAXBench and KernelBench: the geometric mean of the best speedup
per workload, a workload without any correct candidate counting 1.0x (the XLA baseline is
the fallback); fast_p, the fraction of workloads with a correct candidate more than p times
faster than XLA; the fraction of proposals that were correct. The same figures are given for
the expert kernels on the workloads that have one. Times are predictions when the timing
source is v6e-sim.
"""

from __future__ import annotations

import csv
import json
import math
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .cache import write_atomic

FAST_P = (0.0, 1.0, 1.5, 2.0)
SETS = ("all", "production", "kernelbench")


def select(spec: str) -> list[str]:
    """Workload names: ``all``, ``production``, ``kernelbench`` or a comma-separated list."""
    import workloads

    sets = {"all": [c.name for c in workloads.PRODUCTION + workloads.KERNELBENCH],
            "production": [c.name for c in workloads.PRODUCTION],
            "kernelbench": [c.name for c in workloads.KERNELBENCH]}
    if spec in sets:
        return sets[spec]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in workloads.WORKLOADS]
    if unknown or not names:
        raise ValueError(f"unknown workloads {unknown or [spec]}; use {', '.join(SETS)} or names from `jaxbench list`")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class BenchSpec:
    """What a bench run is: a re-run with an equal spec resumes it."""

    policy: str
    steps: int
    backend: str = "sim"
    seed: int | None = 0
    policy_kwargs: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)  # workload name -> config overrides
    experts: bool = True  # also evaluate the expert kernel where the workload has one
    timeout_s: float = 300.0
    timing_only: bool = False  # explore unchecked (the env's timing_only); check the best at the end

    def for_workload(self, name: str) -> dict:
        """The part of the spec a workload's result depends on (what its saved row must match)."""
        return {"policy": self.policy, "steps": self.steps, "backend": self.backend, "seed": self.seed,
                "policy_kwargs": self.policy_kwargs, "config": self.configs.get(name, {}), "experts": self.experts,
                **({"timing_only": True} if self.timing_only else {})}


def run_workload(name: str, spec: BenchSpec, cache_dir: str | None = None,
                 on_progress: Callable[[str], None] | None = None) -> dict:
    """One workload's row: the policy's search from the template's default, and the expert.
    ``on_progress`` is told what is running ("step 3/8: compile"). Never raises: a workload
    that cannot run at all gets a row with its error."""
    import gymnasium as gym

    import jaxbench_env  # noqa: F401  (registers the envs)
    import workloads
    from policies import POLICY_ACTION_MODE, make_policy, run_policy

    t0 = time.perf_counter()
    cls = workloads.WORKLOADS[name]
    row: dict[str, Any] = {
        "workload": name, "jaxbench_id": cls.jaxbench_id, "category": cls.category, "policy": spec.policy,
        "steps": 0, "node": _node(), "error": None, "has_expert": bool(cls.expert_file)}
    records: list[dict] = []
    env = None
    where = {"step": "reset"}

    def tell(text: str) -> None:
        if on_progress is not None:
            on_progress(text)

    try:
        env = gym.make(f"JAXBench/{name}-v0", action_mode=POLICY_ACTION_MODE[spec.policy],
                       config=spec.configs.get(name), backend=spec.backend, max_steps=spec.steps,
                       cache_dir=cache_dir, timeout_s=spec.timeout_s, timing_only=spec.timing_only)
        u = env.unwrapped
        u.evaluator.on_stage = lambda stage: tell(f"{where['step']}: {stage}")
        tell("reset")
        _, info = env.reset(seed=spec.seed)
        row.update(config=u.workload.config, backend=u.evaluator.backend, timing_source=info["timing_source"],
                   baseline_ms=info["baseline_ms"], start_ms=info["time_ms"], start_speedup=info["speedup"])
        # An LLM policy's transcript (and the one it replays) is the workload's own.
        policy = make_policy(spec.policy, **{k: v.format(workload=name) if k in ("transcript", "replay") and v else v
                                             for k, v in spec.policy_kwargs.items()})
        policy.reset()

        def step_done(rec: dict) -> None:
            where["step"] = f"step {rec['step'] + 1}/{spec.steps}"

        where["step"] = f"step 1/{spec.steps}"
        records = run_policy(policy, env, spec.steps, reset=False, callback=step_done)
        correct = [r for r in records if r["correct"] is not False and r["speedup"] is not None]
        # The best over the start (the template's default, where every search begins) and the steps.
        found = [(info["speedup"], info["schedule"])] + [(r["speedup"], r["schedule"]) for r in correct]
        found = sorted((f for f in found if f[0]), key=lambda f: -f[0])
        best, best_schedule = found[0] if found else (None, None)
        row.update(steps=len(records), correct_proposals=len(correct),
                   correct_rate=len(correct) / len(records) if records else None,
                   trusted_timing=all(r.get("trusted_timing", True) for r in correct))
        if spec.timing_only:  # the search saw unchecked times: the best that passes the check counts
            where["step"] = "check"
            row.update(best_unchecked_speedup=best, **_check_best(u, found))
            best, best_schedule = row["best_speedup"], row["best_schedule"]
        row.update(best_speedup=best, best_ms=row["baseline_ms"] / best if best else None,
                   best_schedule=best_schedule)
        if spec.experts and cls.expert_file:
            where["step"] = "expert"
            tell("expert")
            expert = u.evaluator.expert()
            row.update(expert_ms=expert.time_ms, expert_speedup=expert.speedup, expert_correct=expert.correct,
                       expert_error=expert.error)
    except Exception as e:  # noqa: BLE001 - one workload's failure is a row, not the end of the suite
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if env is not None:
            env.close()
    row["wall_s"] = time.perf_counter() - t0
    return {"spec": spec.for_workload(name), "versions": code_versions(), "row": row, "records": records}


CHECKS = 3  # a timing-only search checks at most this many of its fastest schedules


def _check_best(env, found: list) -> dict:
    """Check the fastest unchecked schedules of the template in order, until one is correct
    (each schedule once: a search that has run out of moves proposes its best again)."""
    from jaxbench_env.candidate import Candidate
    from policies.base import schedule_key

    failures, distinct = [], {}
    for _, schedule in found:
        distinct.setdefault(schedule_key(schedule, env.schedule_space), schedule)
    for schedule in list(distinct.values())[:CHECKS]:
        result = env.evaluator.evaluate(Candidate(env.workload.template_source(), schedule))
        if result.ok:
            return {"best_speedup": result.speedup, "best_schedule": schedule, "check_failures": failures}
        failures.append({"schedule": schedule, "error": result.error})
    return {"best_speedup": None, "best_schedule": None, "check_failures": failures}


def _node() -> str:
    """The Ray node running this (in a Ray task), else the host name."""
    ray = sys.modules.get("ray")  # only a Ray worker has imported it
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return socket.gethostname()


# --- the suite's figures -----------------------------------------------------------------------

def geomean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fast_p(speedups: list[float | None], p: float) -> float | None:
    """Fraction of workloads with a correct candidate faster than p times XLA (None: none correct)."""
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups) if speedups else None


def figures(speedups: list[float | None], proposals: int | None = None, correct: int | None = None) -> dict:
    return {"workloads": len(speedups),
            "without_correct": sum(1 for s in speedups if s is None),
            "geomean_speedup": geomean(s if s is not None else 1.0 for s in speedups),
            "fast_p": {str(p): fast_p(speedups, p) for p in FAST_P},
            "correct_rate": correct / proposals if proposals else None}


def summarize(rows: list[dict]) -> dict:
    """The suite figures of the policy and, on the workloads with one, of the experts."""
    ran = [r for r in rows if r.get("error") is None]
    out = {"policy": figures([r.get("best_speedup") for r in ran], sum(r["steps"] for r in ran),
                             sum(r.get("correct_proposals", 0) for r in ran)),
           "failed_workloads": [r["workload"] for r in rows if r.get("error") is not None],
           "timing_sources": sorted({r["timing_source"] for r in ran if r.get("timing_source")})}
    experts = [r for r in ran if "expert_ms" in r]
    if experts:
        out["expert"] = figures([r.get("expert_speedup") for r in experts])
        out["expert"]["unchecked"] = [r["workload"] for r in experts if r.get("expert_correct") is None]
        out["policy_on_expert_workloads"] = figures([r.get("best_speedup") for r in experts])
    return out


# --- files -----------------------------------------------------------------------------------

CSV_COLUMNS = ("workload", "jaxbench_id", "category", "policy", "backend", "timing_source", "baseline_ms",
               "start_speedup", "best_ms", "best_speedup", "steps", "correct_proposals", "correct_rate",
               "expert_ms", "expert_speedup", "expert_correct", "wall_s", "node", "error")


def write(out: Path, spec: BenchSpec, rows: list[dict], summary: dict) -> None:
    write_atomic(out / "results.json", json.dumps({"spec": asdict(spec), "summary": summary, "rows": rows},
                                                   indent=1, default=str))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(out / "results.png", spec, rows)


def plot(path: Path, spec: BenchSpec, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["workload"] for r in rows]
    best = [r.get("best_speedup") or float("nan") for r in rows]
    fig, (bars, curve) = plt.subplots(2, 1, figsize=(max(8, 0.28 * len(rows) + 2), 9),
                                      gridspec_kw={"height_ratios": [3, 2]})
    xs = range(len(rows))
    bars.bar(xs, [b - 1.0 for b in best], bottom=1.0, color="tab:blue",  # from 1x: above or below XLA
             label=f"{spec.policy}, best of {spec.steps} steps")
    ex = [(i, r["expert_speedup"]) for i, r in enumerate(rows) if r.get("expert_speedup")]
    if ex:
        bars.scatter([i for i, _ in ex], [s for _, s in ex], marker="*", s=90, color="tab:red", zorder=3,
                     label="expert kernel")
    bars.axhline(1.0, color="black", lw=0.8)
    bars.set_yscale("log")
    bars.set_xticks(list(xs), names, rotation=90, fontsize=7)
    source = ", ".join(sorted({r.get("timing_source") or "?" for r in rows}))
    bars.set_ylabel(f"speedup over XLA ({'predicted' if source == 'v6e-sim' else source})")
    bars.legend(fontsize=8)
    ps = [i / 20 for i in range(0, 61)]
    policy_speedups = [r.get("best_speedup") for r in rows if r.get("error") is None]
    curve.step(ps, [fast_p(policy_speedups, p) for p in ps], where="post", label=spec.policy)
    expert_speedups = [r.get("expert_speedup") for r in rows if "expert_ms" in r]
    if expert_speedups:
        curve.step(ps, [fast_p(expert_speedups, p) for p in ps], where="post", label="experts (their workloads)",
                   color="tab:red")
    curve.set_xlabel("p (speedup threshold)")
    curve.set_ylabel("fast_p")
    curve.set_ylim(0, 1.02)
    curve.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the run ---------------------------------------------------------------------------------

def code_versions() -> dict:
    """What a saved row depends on besides its spec: the evaluation's versions (jax, libtpu,
    this package's code) and the policies' code."""
    import policies

    from .evaluation import package_versions, source_digest

    return {**package_versions(), "policies": source_digest(Path(policies.__file__).resolve().parent)}


def saved(out: Path, name: str, spec: BenchSpec, versions: dict) -> dict | None:
    """A finished workload's saved result for this spec and this code (``versions``, from
    ``code_versions``), if there is one."""
    path = out / "workloads" / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("spec") != json.loads(json.dumps(spec.for_workload(name), default=str)):
        return None
    if data.get("versions") != versions:  # other code: its row is not this product's
        return None
    return data if not data.get("row", {}).get("error") else None  # a failed workload is tried again


def save(out: Path, name: str, result: Mapping) -> None:
    write_atomic(out / "workloads" / f"{name}.json", json.dumps(result, indent=1, default=str))


def bench(spec: BenchSpec, names: list[str], out: Path, cache_dir: str | None = None,
          ray_address: str | None = None, workers: int | None = None, show_progress: bool = True) -> dict:
    """Run ``spec`` over ``names`` (here, or as Ray tasks when ``ray_address`` or
    ``workers`` is given), resuming from ``out``; returns what ``results.json`` holds."""
    (out / "workloads").mkdir(parents=True, exist_ok=True)
    versions = code_versions()
    results = {n: saved(out, n, spec, versions) for n in names}
    todo = [n for n in names if results[n] is None]
    from tqdm import tqdm

    bar = tqdm(total=len(names), initial=len(names) - len(todo), unit="workload", disable=not show_progress,
               dynamic_ncols=True)
    try:
        runner = _on_ray(todo, spec, cache_dir, ray_address, workers) if (ray_address or workers) \
            else _here(todo, spec, cache_dir, bar)
        for name, result in runner:
            save(out, name, result)
            results[name] = result
            r = result["row"]
            s = r.get("best_speedup")
            bar.write(f"{name}: " + (f"error {r['error']}" if r.get("error") else
                                     f"best {s:.3f}x" if s else "no correct candidate")
                      + f" ({r.get('wall_s', 0):.0f} s)")
            bar.update(1)
    finally:
        bar.close()
    rows = [results[n]["row"] for n in names]
    summary = summarize(rows)
    write(out, spec, rows, summary)
    return {"spec": asdict(spec), "summary": summary, "rows": rows}


def _here(names, spec, cache_dir, bar):
    for name in names:
        def show(text, name=name):
            bar.set_postfix_str(f"{name} {text}", refresh=True)

        show("start")
        yield name, run_workload(name, spec, cache_dir, show)


def _on_ray(names, spec, cache_dir, address, workers):
    """Each workload a Ray task (one CPU each) with its own evaluator: results as they finish."""
    import ray

    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_workload)
        pending = {task.remote(n, spec, cache_dir): n for n in names}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            name = pending.pop(done[0])
            try:
                yield name, ray.get(done[0])
            except Exception as e:  # noqa: BLE001 - a lost node: the workload's row says so
                yield name, {"spec": spec.for_workload(name), "records": [],
                             "row": {"workload": name, "policy": spec.policy, "steps": 0,
                                     "error": f"ray task failed: {type(e).__name__}: {e}"}}
    finally:
        if started:
            ray.shutdown()
