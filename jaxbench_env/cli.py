"""The ``jaxbench`` command line: list workloads, time baselines, evaluate and optimize kernels.

    jaxbench list [--json]
    jaxbench show gemm [--config M=1024] [--json]
    jaxbench baseline gemm [--config M=1024,K=1024,N=2048] [--backend sim] [--expert] [--json]
    jaxbench evaluate gemm [--kernel my_kernel.py] [--schedule block_m=256] [--json]
    jaxbench optimize gemm --policy greedy --steps 20 --out runs/gemm [--json]
    jaxbench optimize gemm --policy llm --base-url http://127.0.0.1:8000/v1 --model m --steps 5 --out runs/llm
    jaxbench optimize gemm --policy llm-beam --base-url URL --model m --steps 8 --out runs/beam
    jaxbench optimize gemm --policy llm-beam --replay runs/beam/transcript.jsonl --steps 8 --out runs/again
    jaxbench optimize gemm --policy expert --steps 1 --out runs/gemm-expert
    jaxbench bench --workloads kernelbench --policy greedy --steps 8 --out runs/suite [--ray-address auto]
    jaxbench sim-report [--json] [--pallas-validation [--rpa-shapes N]]

Times are predictions of the v6e simulator when the timing source is "v6e-sim" (no TPU
here) and measurements on a TPU otherwise. Bad input exits with status 2 and one line on
stderr. Results are cached under $JAXBENCH_CACHE_DIR (or ~/.cache/jaxbench_gym).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from action_space.source_edit import with_schedule
from jaxbench_env.evaluation import BACKENDS


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


def parse_value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_pairs(text: str | None, what: str) -> dict:
    """``"A=1,B=x"`` -> ``{"A": 1, "B": "x"}`` (int, then float, else string)."""
    out: dict = {}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad {what} item {part!r}: expected KEY=VALUE")
        out[key.strip()] = parse_value(value.strip())
    return out


def timing_word(timing_source: str) -> str:
    return "predicted" if timing_source == "v6e-sim" else "measured"


def fmt_ms(x) -> str:
    return "n/a" if x is None else f"{x:.4f} ms"


def short(err: str | None, n: int = 60) -> str:
    if not err:
        return ""
    line = err.strip().splitlines()[0] if err.strip() else ""
    return line if len(line) <= n else line[: n - 3] + "..."


def fmt_schedule(schedule: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in schedule.items())


def fmt_correct(result) -> str:
    """"True"/"False", or what was done instead where correctness was not checked."""
    return "not checked (compile-checked only on the CPU)" if result.correct is None else str(result.correct)


# --- shared checks ---------------------------------------------------------------------
def _workload(name: str, config: dict):
    import workloads

    try:
        return workloads.get(name, config)
    except KeyError as e:
        raise UsageError(e.args[0] if e.args else str(e)) from None
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config for {name}: {e}") from None


def _backend(backend: str) -> str:
    from jaxbench_env.evaluation import resolve_backend

    try:
        return resolve_backend(backend)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _evaluator(args, config):
    from jaxbench_env.evaluation import Evaluator

    _workload(args.workload, config)
    _backend(args.backend)
    ev = Evaluator(args.workload, config, args.backend, cache_dir=args.cache_dir, timeout_s=args.timeout)
    show_stages(ev, args.workload)
    return ev


def show_stages(evaluator, label: str) -> None:
    """Name each stage of an uncached evaluation on stderr as it starts (long steps are not silent)."""
    evaluator.on_stage = lambda stage: print(f"[jaxbench] {label}: {stage}...", file=sys.stderr, flush=True)


# --- subcommands -------------------------------------------------------------------------
def cmd_list(args) -> int:
    from workloads import WORKLOADS

    rows = []
    for name, cls in WORKLOADS.items():
        wl = cls()
        space = wl.schedule_space()
        rows.append({"name": name, "jaxbench_id": cls.jaxbench_id, "category": cls.category,
                     "description": cls.description, "config": wl.config, "env_id": f"JAXBench/{name}-v0",
                     "knobs": {k.name: list(k.values) for k in space.knobs},
                     "expert": bool(cls.expert_file)})
        if args.rungs:
            rows[-1]["check_rungs"] = [wl.shrunk(r) for r in wl.check_rungs()]
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    width = max([len(r["name"]) for r in rows] + [4])
    cat = max(len(r["category"]) for r in rows)
    print(f"{'name':<{width}}  id    {'category':<{cat}}  expert  description")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['jaxbench_id']:<5} {r['category']:<{cat}}  {'yes' if r['expert'] else '-':<6}  "
              f"{r['description']}")
        print(f"{'':<{width}}  config: {', '.join(f'{k}={v}' for k, v in r['config'].items())}")
        for i, rung in enumerate(r.get("check_rungs", [])):
            shrunk = ", ".join(f"{k}={v}" for k, v in rung.items()) or "the full size"
            print(f"{'':<{width}}  check rung {i}: {shrunk}")
        if r.get("check_rungs") and r["check_rungs"][-1]:
            print(f"{'':<{width}}  (no rung past this: its inputs or the reference's intermediates exceed the check's cap)")
    return 0


def cmd_show(args) -> int:
    wl = _workload(args.workload, parse_pairs(args.config, "--config"))
    space = wl.schedule_space()
    rungs = wl.check_rungs()
    obj = {"name": wl.name, "jaxbench_id": wl.jaxbench_id, "category": wl.category, "description": wl.description,
           "config": wl.config, "defaults": dict(wl.defaults), "check_config": rungs[0],
           "check_rungs": [wl.shrunk(r) for r in rungs], "atol": wl.atol, "rtol": wl.rtol,
           "float32_check": wl.float32_check,
           "knobs": [{"name": k.name, "values": list(k.values), "default": k.default} for k in space.knobs],
           "default_schedule": space.default(), "expert": wl.expert_file or None,
           "expert_checked_on_cpu": bool(wl.expert_file) and wl.expert_checks_on_cpu,
           "env_id": f"JAXBench/{wl.name}-v0"}
    if args.json:
        print(json.dumps(obj, default=str))
        return 0
    print(f"{wl.name} ({wl.jaxbench_id}, {wl.category}): {wl.description}")
    print(f"  env id: {obj['env_id']}")
    print("  config (full size; --config KEY=VALUE overrides):")
    for k, v in wl.config.items():
        changed = "" if wl.defaults.get(k) == v else f"  (default {wl.defaults.get(k)})"
        print(f"    {k} = {v}{changed}")
    shrunk = ", ".join(f"{k}={v}" for k, v in wl.shrunk(rungs[0]).items()) or "the full size"
    print(f"  correctness check: interpret mode at {shrunk}, 3 seeds, atol {wl.atol:g}, rtol {wl.rtol:g}"
          + (" (against a float32 reference)" if wl.float32_check else ""))
    print(f"  check-size ladder: {len(rungs)} rung(s) (jaxbench list --rungs)")
    limit = space.check(space.default()) if space.knobs and not any(
        space.check(sched) is None for sched in space.all_schedules()) else None
    if limit:
        print(f"  template: cannot serve this config ({limit}); source actions and kernel files still can")
    print("  schedule knobs (legal values; * the default):")
    for k in space.knobs:
        values = " ".join(f"{v}*" if v == k.default else str(v) for v in k.values)
        print(f"    {k.name}: {values}")
    if not space.knobs:
        print("    (none)")
    expert = "none" if not wl.expert_file else f"workloads/experts/{wl.expert_file}" + (
        "" if wl.expert_checks_on_cpu else " (compile-checked only off-TPU)")
    print(f"  expert kernel: {expert}")
    return 0


def cmd_baseline(args) -> int:
    config = parse_pairs(args.config, "--config")
    if args.expert and not _workload(args.workload, config).expert_file:
        import workloads

        raise UsageError(f"{args.workload} has no expert kernel; experts exist for: "
                         f"{', '.join(sorted(workloads.with_expert()))}")
    ev = _evaluator(args, config)
    try:
        base = ev.baseline()
        expert = ev.expert() if args.expert else None
    finally:
        ev.close()
    obj = {"workload": args.workload, "config": ev.workload.config, "backend": ev.backend,
           "timing_source": base.timing_source, "time_ms": base.time_ms, "cached": base.cached}
    if expert is not None:
        obj["expert"] = {k: getattr(expert, k) for k in (
            "timing_source", "compiled", "correct", "max_abs_err", "time_ms", "speedup", "error", "cached")}
        obj["expert"]["check"] = expert.details.get("check", "interpret mode at check size, 3 seeds")
    if args.json:
        print(json.dumps(obj, default=str))
        return 0
    word = timing_word(base.timing_source)
    print(f"{args.workload} XLA baseline: {fmt_ms(base.time_ms)} ({word}, {base.timing_source}) "
          f"at {ev.workload.config}")
    if expert is not None:
        speedup = "n/a" if expert.speedup is None else f"{expert.speedup:.3f}x"
        print(f"{args.workload} expert:       {fmt_ms(expert.time_ms)} ({word}, {expert.timing_source}), "
              f"speedup {speedup}, compiled {expert.compiled}, correct {fmt_correct(expert)}")
        if expert.error:
            print(f"  error: {expert.error}")
    return 0


def cmd_evaluate(args) -> int:
    from jaxbench_env.candidate import Candidate

    config = parse_pairs(args.config, "--config")
    overrides = parse_pairs(args.schedule, "--schedule")
    wl = _workload(args.workload, config)
    space = wl.schedule_space()
    unknown = sorted(set(overrides) - set(space.names))
    if unknown:
        raise UsageError(f"unknown schedule knobs {unknown} for {args.workload}; known: {list(space.names)}")
    if args.kernel:
        path = Path(args.kernel)
        try:
            source = path.read_text()
        except OSError as e:
            raise UsageError(f"cannot read kernel file {args.kernel}: {e.strerror or e}") from None
        schedule = overrides  # the file's own SCHEDULE holds the rest
    else:
        source = wl.template_source()
        schedule = {**space.default(), **overrides}
        reason = space.check(schedule)
        if reason is not None:
            raise UsageError(f"schedule rejected: {reason}")
    ev = _evaluator(args, config)
    try:
        result = ev.evaluate(Candidate(source, schedule))
    finally:
        ev.close()
    if args.json:  # the whole result: its details carry the simulator's breakdown and caveats
        obj = {**result.to_dict(), "config": ev.workload.config, "schedule": schedule, "kernel": args.kernel}
        print(json.dumps(obj, default=str))
        return 0
    word = timing_word(result.timing_source)
    print(f"{args.workload} {'kernel ' + args.kernel if args.kernel else 'template'} "
          f"schedule {fmt_schedule(schedule) or '(module default)'}")
    print(f"  compiled: {result.compiled}  correct: {fmt_correct(result)}  max abs err: {result.max_abs_err}")
    print(f"  time: {fmt_ms(result.time_ms)} ({word}, {result.timing_source})  "
          f"XLA baseline: {fmt_ms(result.baseline_ms)} ({word})")
    print(f"  speedup: {'n/a' if result.speedup is None else f'{result.speedup:.3f}x'}")
    if result.time_ms is not None and not result.trusted_timing:
        print(f"  timing NOT trusted: a bound set it ({'; '.join(result.details['sim']['bounds'])})")
    for caveat in (result.details.get("sim") or {}).get("caveats") or []:
        print(f"  caveat: {caveat}")
    if result.error:
        print(f"  error: {result.error}")
    return 0


LLM_POLICIES = ("llm", "llm-beam")


def policy_kwargs(args, transcript: str | None = None) -> dict:
    """The options of ``--policy`` from the command line. For the LLM policies, ``transcript``
    is where the exchanges are recorded (``{workload}`` is filled in per workload)."""
    if args.policy in LLM_POLICIES:
        if not (args.base_url or args.replay or os.environ.get("OPENAI_BASE_URL")):
            raise UsageError(f"--policy {args.policy} needs --base-url (an OpenAI-compatible endpoint), "
                             "OPENAI_BASE_URL, or --replay TRANSCRIPT")
        if args.replay and "{workload}" not in args.replay and not Path(args.replay).is_file():
            raise UsageError(f"--replay {args.replay}: no such transcript")
        kw = {"base_url": args.base_url, "model": args.model, "api_key": args.api_key, "replay": args.replay,
              "transcript": transcript, "max_requests": args.max_requests,
              "max_total_tokens": args.max_total_tokens, "temperature": args.temperature}
        if args.policy == "llm-beam":
            kw.update(beam_width=args.beam_width, n_plans=args.plans, concurrency=args.concurrency)
        return kw
    if args.policy == "beam":
        return {"beam_width": args.beam_width}
    kw = {"seed": args.seed} if args.policy in ("random", "gradient") and args.seed is not None else {}
    if args.policy == "random" and args.legal_only:
        kw["legal_only"] = True
    return kw


def policy_client(policy):
    """The chat client of an LLM policy (``llm``'s own, ``llm-beam``'s proposer's)."""
    return getattr(policy, "client", None) or getattr(getattr(policy, "proposer", None), "client", None)


def suite_configs(text: str | None, names: list[str]) -> dict:
    """``--config`` for a suite: ``KEY=V`` sets KEY on every selected workload that has it,
    ``NAME.KEY=V`` on one workload; a key no selected workload has is an error."""
    import workloads

    configs: dict = {}
    for key, value in parse_pairs(text, "--config").items():
        name, dot, knob = key.rpartition(".")
        targets = [name] if dot else names
        if dot and name not in names:
            raise UsageError(f"--config names {name!r}, which is not among the selected workloads")
        hit = [n for n in targets if knob in workloads.get(n).config]
        if not hit:
            raise UsageError(f"--config key {knob!r} is not in the config of {'/'.join(targets[:3])}"
                             f"{'...' if len(targets) > 3 else ''}")
        for n in hit:
            configs.setdefault(n, {})[knob] = value
    for n, config in configs.items():
        _workload(n, config)
    return configs


def cmd_bench(args) -> int:
    from jaxbench_env import suite
    from policies import POLICY_ACTION_MODE

    try:
        names = suite.select(args.workloads)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.policy == "expert":
        raise UsageError("bench reports the experts beside every policy: choose a search policy")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.timing_only and POLICY_ACTION_MODE.get(args.policy) != "schedule":
        raise UsageError("--timing-only is for schedule policies (random, greedy, beam, gradient)")
    if (args.ray_address or args.workers) and importlib.util.find_spec("ray") is None:
        raise UsageError("--ray-address and --workers need Ray: pip install 'jaxbench-gym[ray]'")
    spec = suite.BenchSpec(policy=args.policy, steps=args.steps, backend=_backend(args.backend), seed=args.seed,
                           policy_kwargs=policy_kwargs(args, str(Path(args.out) / "transcripts" / "{workload}.jsonl")),
                           configs=suite_configs(args.config, names),
                           experts=not args.no_experts, timeout_s=args.timeout, timing_only=args.timing_only)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out directory {args.out}: {e.strerror or e}") from None
    result = suite.bench(spec, names, out, cache_dir=args.cache_dir, ray_address=args.ray_address,
                         workers=args.workers, show_progress=not args.json)
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    print_bench(result)
    print(f"wrote {out / 'results.json'}, {out / 'results.csv'} and {out / 'results.png'}")
    return 0


def print_bench(result: dict) -> None:
    rows, summary = result["rows"], result["summary"]
    sources = summary["timing_sources"]
    word = "predicted" if sources == ["v6e-sim"] else "measured" if sources else "n/a"
    print(f"\n{'workload':<44} {'XLA ms':>9} {'best ms':>9} {'speedup':>8} {'steps':>5} {'correct':>7} "
          f"{'expert':>8}  timing")
    for r in rows:
        if r.get("error"):
            print(f"{r['workload']:<44} error: {short(r['error'], 70)}")
            continue
        best = "-" if r.get("best_speedup") is None else f"{r['best_speedup']:.3f}x"
        expert = f"{r['expert_speedup']:.3f}x" if r.get("expert_speedup") else "-"
        rate = "-" if r.get("correct_rate") is None else f"{r['correct_rate']:.0%}"
        print(f"{r['workload']:<44} {r['baseline_ms']:>9.4f} {r['best_ms'] or float('nan'):>9.4f} {best:>8} "
              f"{r['steps']:>5} {rate:>7} {expert:>8}  {r.get('timing_source')}")

    def line(label, f):
        fp = "  ".join(f"fast_{p}={v:.2f}" for p, v in f["fast_p"].items() if v is not None)
        rate = "" if f["correct_rate"] is None else f", correct rate {f['correct_rate']:.0%}"
        print(f"{label}: geomean {f['geomean_speedup']:.3f}x over {f['workloads']} workloads "
              f"({f['without_correct']} without a correct candidate, counted 1.0x){rate}; {fp}")

    print(f"\nspeedups over XLA ({word} times)")
    line(result["spec"]["policy"], summary["policy"])
    if "expert" in summary:
        line("experts, on their workloads", summary["expert"])
        line(f"{result['spec']['policy']}, on the same workloads", summary["policy_on_expert_workloads"])
    if summary["failed_workloads"]:
        print(f"failed (not in the figures; re-run to retry): {', '.join(summary['failed_workloads'])}")


def cmd_optimize(args) -> int:
    import gymnasium as gym

    import jaxbench_env  # noqa: F401  (registers the envs)
    from policies import POLICY_ACTION_MODE, make_policy, run_policy

    config = parse_pairs(args.config, "--config")
    _workload(args.workload, config)
    _backend(args.backend)
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.policy == "expert" and not _workload(args.workload, config).expert_file:
        raise UsageError(f"{args.workload} has no expert kernel for --policy expert")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out directory {args.out}: {e.strerror or e}") from None
    transcript = out / "transcript.jsonl" if args.policy in LLM_POLICIES else None
    if transcript is not None and transcript.exists():
        if args.replay and Path(args.replay).resolve() == transcript.resolve():
            raise UsageError("--replay must not be the transcript this run writes: use another --out")
        transcript.unlink()  # a run's transcript is that run's alone
    policy = make_policy(args.policy, **policy_kwargs(args, transcript and str(transcript)))

    env = gym.make(f"jaxbench_env:JAXBench/{args.workload}-v0", action_mode=POLICY_ACTION_MODE[args.policy],
                   config=config, backend=args.backend, max_steps=args.steps, cache_dir=args.cache_dir,
                   timeout_s=args.timeout)
    show_stages(env.unwrapped.evaluator, args.workload)
    try:
        _, info0 = env.reset(seed=args.seed)
        policy.reset()
        word = timing_word(info0["timing_source"])
        print(f"[jaxbench] {args.workload}: XLA baseline {fmt_ms(info0['baseline_ms'])} ({word}); start "
              f"{fmt_ms(info0['time_ms'])}, speedup {info0['speedup'] or 0:.3f}x; policy {args.policy}, "
              f"{args.steps} steps", file=sys.stderr, flush=True)

        def progress(rec):
            s = "FAIL" if rec["speedup"] is None else f"{rec['speedup']:.3f}x"
            print(f"[jaxbench] step {rec['step']}/{args.steps}: {s} {fmt_ms(rec['time_ms'])} ({word}) "
                  f"schedule {fmt_schedule(rec['schedule'])}{'  ' + short(rec['error']) if rec['error'] else ''}",
                  file=sys.stderr, flush=True)

        records = run_policy(policy, env, args.steps, reset=False, callback=progress)
        u = env.unwrapped
        config_used = dict(u.workload.config)
        best_source, best_schedule = u.best if u.best is not None else (u.source, dict(u.schedule))
        best_speedup = u.best_speedup
    finally:
        env.close()

    (out / "best_kernel.py").write_text(with_schedule(best_source, best_schedule))
    start = {k: info0.get(k) for k in ("schedule", "time_ms", "speedup", "correct", "cached", "error")}
    replay = None
    if args.policy in LLM_POLICIES and args.replay:
        from policies.llm_client import replay_check

        replay = replay_check(args.replay, transcript)
        replay["versions_differ"] = policy_client(policy).versions_differ
    (out / "log.json").write_text(json.dumps(
        {"workload": args.workload, "config": config_used, "policy": args.policy, "backend": info0["backend"],
         "timing_source": info0["timing_source"], "baseline_ms": info0["baseline_ms"], "start": start,
         "steps": records, "transcript": transcript and str(transcript), "replay": replay}, indent=1, default=str))

    if replay is not None:
        print(f"[jaxbench] replay of {args.replay}: {replay['same']} scores as recorded, {len(replay['differ'])} "
              f"different, {len(replay['missing'])} not reached"
              + (f"; versions differ: {replay['versions_differ']}" if replay["versions_differ"] else ""),
              file=sys.stderr, flush=True)
    summary = {"workload": args.workload, "policy": args.policy, "steps": len(records),
               "timing_source": info0["timing_source"], "baseline_ms": info0["baseline_ms"],
               "start_speedup": info0["speedup"], "best_speedup": best_speedup, "best_schedule": best_schedule,
               "best_kernel": str(out / "best_kernel.py"), "log": str(out / "log.json")}
    if args.json:
        print(json.dumps(summary, default=str))
        return 0
    print(f"{'step':>4}  {'schedule':<55} {'speedup':>8}  {'correct':<7}  error")
    for rec in records:
        s = "-" if rec["speedup"] is None else f"{rec['speedup']:.3f}x"
        print(f"{rec['step']:>4}  {fmt_schedule(rec['schedule']):<55} {s:>8}  {str(rec['correct']):<7}  "
              f"{short(rec['error'], 50)}")
    print(f"best speedup {best_speedup:.3f}x ({word} times) at {fmt_schedule(best_schedule)}")
    print(f"wrote {out / 'best_kernel.py'} and {out / 'log.json'}")
    return 0


def cmd_sim_report(args) -> int:
    from jaxbench_env import calibrate
    from jaxbench_env.sim import calibration

    if args.backend not in ("auto", "sim"):
        raise UsageError("sim-report reports the simulator: use --backend sim (or leave the default)")
    rows = calibrate.gather(calibrate.published_rows(), cache_dir=args.cache_dir,
                            progress=None if args.json else lambda r: print(f"# compiled {r.label}", flush=True))
    rep = calibrate.report(rows, calibration())
    rep["gemm_sweep"] = calibrate.gemm_sweep(args.cache_dir)
    if args.json:
        if args.pallas_validation:
            rep["pallas_validation"] = pallas_validation(args.rpa_shapes, as_json=True)
        print(json.dumps(rep, indent=1))
        return 0
    print(f"\nv6e simulator (calibration {rep['calibration']}) against published v6e medians "
          f"({calibrate.PUBLISHED.name}); times in ms, predicted by the simulator\n")
    print(f"{'row':<52} {'measured':>9} {'predicted':>9} {'log err':>8} {'optimal_s':>9} {'log err':>8}")
    for t in rep["rows"]:
        opt = "-" if t["optimal_ms"] is None else f"{t['optimal_ms']:.3f}"
        opt_err = "-" if t["optimal_log_error"] is None else f"{t['optimal_log_error']:+.3f}"
        print(f"{t['row']:<52} {t['measured_ms']:>9.3f} {t['predicted_ms']:>9.3f} {t['log_error']:>+8.3f} "
              f"{opt:>9} {opt_err:>8}")
    print()
    for name in ("simulator", "simulator_on_optimal_rows", "optimal_seconds", "simulator_on_xla_baselines",
                 "optimal_seconds_on_xla_baselines"):
        e = rep[name]
        print(f"{name:<33} {e['rows']:>2} rows  Spearman {e['spearman']:.3f}  median |log error| {e['median_abs_log_error']:.3f} "
              f"(x{math.exp(e['median_abs_log_error']):.2f})  max |log error| {e['max_abs_log_error']:.3f} "
              f"(x{math.exp(e['max_abs_log_error']):.2f})")
    print("\ngemm template at full size (8192x8192 @ 8192x28672), predicted per schedule:")
    for t in rep["gemm_sweep"]:
        whole_k = t["schedule"].get("accumulator") == "none"
        sched = ", ".join(f"{k}={'K' if k == 'block_k' and whole_k else t['schedule'][k]}"
                          for k in ("block_m", "block_k", "block_n", "buffers"))
        time_txt = f"{t['time_ms']:.3f} ms ({t['steps']} steps, compute from {t['compute_from']})" \
            if t["time_ms"] is not None else f"rejected: {short(t['error'], 70)}"
        print(f"  {sched:<52} {time_txt}")
    if args.pallas_validation:
        pallas_validation(args.rpa_shapes)
    return 0


def pallas_validation(rpa_shapes: int, as_json: bool = False):
    """The simulator against public Pallas timings (``jaxbench_env.validation``: the matmul
    and sparse guides' v5e rows and jax's tuned RPA blocks), in a fresh process: its compiles need
    ``aot.prepare_process`` before libtpu loads. Prints its tables, or returns its JSON."""
    import subprocess

    cmd = [sys.executable, "-m", "jaxbench_env.validation", "--rpa-shapes", str(rpa_shapes)]
    if as_json:
        proc = subprocess.run(cmd + ["--json", "--quiet"], stdout=subprocess.PIPE, text=True)
        if proc.returncode:
            return {"error": f"python -m jaxbench_env.validation exited with status {proc.returncode}"}
        return json.loads(proc.stdout)
    print("\nPallas kernels against public timings outside the fitted set (progress on stderr):", flush=True)
    proc = subprocess.run(cmd)
    if proc.returncode:
        print(f"pallas validation failed: exit status {proc.returncode}")
    return None


# --- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="sim: v6e simulator (predicted times); tpu: measure on a TPU; auto: tpu if present")
    common.add_argument("--config", help="workload config overrides, KEY=VALUE,... (e.g. M=1024,K=1024,N=2048)")
    common.add_argument("--json", action="store_true", help="machine-readable JSON output")
    common.add_argument("--cache-dir", default=None, help="result cache (default $JAXBENCH_CACHE_DIR)")
    common.add_argument("--timeout", type=float, default=300.0, help="seconds per evaluation")

    # The options of the search policies (policy_kwargs reads them), for optimize and bench.
    policy_options = argparse.ArgumentParser(add_help=False)
    policy_options.add_argument("--beam-width", type=int, default=4, help="beam width of beam and llm-beam")
    policy_options.add_argument("--legal-only", action="store_true",
                                help="random: sample again until the whole schedule passes the space's check "
                                     "(the action mask constrains one knob at a time)")
    llm = policy_options.add_argument_group("LLM policies (llm, llm-beam)")
    llm.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                                        "(default $OPENAI_BASE_URL)")
    llm.add_argument("--model", help="model name (default $OPENAI_MODEL)")
    llm.add_argument("--api-key", default=None, help="API key (default $OPENAI_API_KEY; never recorded)")
    llm.add_argument("--replay", help="answer from this recorded transcript instead of an endpoint")
    llm.add_argument("--plans", type=int, default=2, help="llm-beam: plans asked per beam member")
    llm.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    llm.add_argument("--temperature", type=float, default=None)
    llm.add_argument("--max-requests", type=int, default=None, help="request budget of the run")
    llm.add_argument("--max-total-tokens", type=int, default=None, help="token budget of the run")

    p = argparse.ArgumentParser(prog="jaxbench", description="JAXBench-Gym: optimize Pallas TPU kernels.")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", parents=[common], help="list the workloads")
    ls.add_argument("--rungs", action="store_true",
                    help="also print each workload's check-size ladder (the dimensions each rung shrinks)")
    sh = sub.add_parser("show", parents=[common], help="a workload's config, check, knobs, tolerance and expert")
    sh.add_argument("workload")
    b = sub.add_parser("baseline", parents=[common], help="time a workload's XLA baseline")
    b.add_argument("workload")
    b.add_argument("--expert", action="store_true",
                   help="also evaluate the expert kernel shipped in jax (where the workload has one)")
    e = sub.add_parser("evaluate", parents=[common], help="evaluate the template or a kernel file")
    e.add_argument("workload")
    e.add_argument("--kernel", help="Python file defining workload(*inputs) (default: the template)")
    e.add_argument("--schedule", help="schedule knobs, KEY=VALUE,... (e.g. block_m=256,order=nm)")
    o = sub.add_parser("optimize", parents=[common, policy_options], help="run a search policy for N steps")
    o.add_argument("workload")
    o.add_argument("--policy", required=True,
                   choices=("random", "greedy", "beam", "gradient", "llm", "llm-beam", "expert"))
    o.add_argument("--steps", type=int, required=True)
    o.add_argument("--out", required=True, help="directory for best_kernel.py and log.json")
    o.add_argument("--seed", type=int, default=None)
    bn = sub.add_parser("bench", parents=[common, policy_options], help="run a policy over a set of workloads: the suite's figures")
    bn.add_argument("--workloads", default="all", help="all, production, kernelbench or NAME,NAME,... (default all)")
    bn.add_argument("--policy", required=True, choices=("random", "greedy", "beam", "gradient", "llm", "llm-beam"))
    bn.add_argument("--steps", type=int, required=True, help="policy steps per workload")
    bn.add_argument("--out", required=True, help="directory for results.json/.csv/.png and per-workload results")
    bn.add_argument("--seed", type=int, default=0)
    bn.add_argument("--no-experts", action="store_true", help="skip the expert kernels")
    bn.add_argument("--timing-only", action="store_true",
                    help="schedule policies: search without the interpret check, then check the three "
                         "fastest schedules found and report the best that passes")
    bn.add_argument("--ray-address", help="run workloads as Ray tasks on this cluster (auto or HOST:PORT)")
    bn.add_argument("--workers", type=int, help="run workloads as tasks of a local Ray instance with N CPUs")
    sr = sub.add_parser("sim-report", parents=[common],
                        help="the v6e simulator against published v6e times, and a gemm block-size sweep")
    sr.add_argument("--pallas-validation", action="store_true",
                    help="then the simulator against public Pallas timings never fitted on: the Pallas TPU "
                         "matmul and sparse guides' v5e times and jax's tuned ragged-paged-attention blocks")
    sr.add_argument("--rpa-shapes", type=int, default=6,
                    help="tuned RPA shapes swept by --pallas-validation (default 6)")
    return p


COMMANDS = {"list": cmd_list, "show": cmd_show, "baseline": cmd_baseline, "evaluate": cmd_evaluate, "optimize": cmd_optimize,
            "bench": cmd_bench, "sim-report": cmd_sim_report}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"jaxbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
