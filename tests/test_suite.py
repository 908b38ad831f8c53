"""``jaxbench bench``: a policy over a set of workloads, its figures and files, resumed, and on a
real two-node Ray cluster started (and stopped) by the test."""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from jaxbench_env import suite

GEMM = "gemm.M=1024,gemm.K=1024,gemm.N=2048"  # test_cli's gemm: its baseline and template are cached


def test_figures_count_a_workload_without_a_correct_candidate_as_xla():
    f = suite.figures([2.0, None, 0.5, 4.0], proposals=10, correct=7)
    assert f["geomean_speedup"] == pytest.approx((2.0 * 1.0 * 0.5 * 4.0) ** 0.25)
    assert f["without_correct"] == 1 and f["correct_rate"] == 0.7
    # fast_0 counts the workloads with any correct candidate; fast_p those faster than p times XLA.
    assert f["fast_p"] == {"0.0": 0.75, "1.0": 0.5, "1.5": 0.5, "2.0": 0.25}


def test_summary_separates_experts_and_failed_workloads():
    rows = [{"workload": "a", "steps": 4, "correct_proposals": 4, "best_speedup": 3.0, "timing_source": "v6e-sim",
             "expert_ms": 1.0, "expert_speedup": 2.0, "expert_correct": True},
            {"workload": "b", "steps": 4, "correct_proposals": 0, "best_speedup": None, "timing_source": "v6e-sim"},
            {"workload": "c", "steps": 0, "error": "RuntimeError: the XLA baseline of c failed"}]
    s = suite.summarize(rows)
    assert s["failed_workloads"] == ["c"] and s["policy"]["workloads"] == 2
    assert s["policy"]["geomean_speedup"] == pytest.approx(3.0 ** 0.5) and s["policy"]["correct_rate"] == 0.5
    assert s["expert"]["workloads"] == 1 and s["expert"]["geomean_speedup"] == pytest.approx(2.0)
    assert s["policy_on_expert_workloads"]["geomean_speedup"] == pytest.approx(3.0)


def test_select_workload_sets():
    assert len(suite.select("all")) == 50 and len(suite.select("production")) == 17
    assert len(suite.select("kernelbench")) == 33 and suite.select("gemm, rmsnorm,gemm") == ["gemm", "rmsnorm"]
    with pytest.raises(ValueError, match="unknown workloads"):
        suite.select("gemm,nonsense")


@pytest.mark.parametrize("args, message", [
    (["--workloads", "gemm,nope"], "unknown workloads"),
    (["--workloads", "gemm", "--config", "Q=3"], "not in the config"),
    (["--workloads", "gemm", "--config", "rmsnorm.N=3"], "not among the selected"),
    (["--workloads", "gemm", "--steps", "0"], "at least 1"),
    (["--workloads", "gemm", "--policy", "llm", "--timing-only", ""], "for schedule policies"),
])
def test_bench_bad_input_is_one_line_and_status_2(cli, tmp_path, args, message):
    base = {"--policy": "greedy", "--steps": "2", "--out": str(tmp_path)}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    p = cli("bench", *[x for kv in base.items() for x in kv if x])
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_bench_writes_the_table_figures_and_plot_and_resumes(cli, tmp_path):
    out = tmp_path / "run"
    args = ("bench", "--workloads", "gemm,rmsnorm", "--config", GEMM, "--policy", "greedy", "--steps", "2",
            "--out", str(out))
    p = cli(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "geomean" in p.stdout and "predicted" in p.stdout
    assert "step 1/2: compile" in p.stderr or "step 1/2: check" in p.stderr  # progress names the stage
    data = json.loads((out / "results.json").read_text())
    rows = {r["workload"]: r for r in data["rows"]}
    assert set(rows) == {"gemm", "rmsnorm"}
    for r in rows.values():
        assert r["error"] is None and r["steps"] == 2 and r["timing_source"] == "v6e-sim"
        assert r["best_speedup"] >= r["start_speedup"] > 0  # the best includes the start
        assert r["best_ms"] == pytest.approx(r["baseline_ms"] / r["best_speedup"])
        assert 0 <= r["correct_rate"] <= 1
    assert {k: rows["gemm"]["config"][k] for k in "MKN"} == {"M": 1024, "K": 1024, "N": 2048}
    assert rows["gemm"]["expert_correct"] and rows["gemm"]["expert_speedup"] > 0  # jax's matmul, tuned blocks
    assert "expert_ms" not in rows["rmsnorm"]
    summary = data["summary"]
    assert summary["policy"]["geomean_speedup"] == pytest.approx(
        (rows["gemm"]["best_speedup"] * rows["rmsnorm"]["best_speedup"]) ** 0.5)
    assert summary["expert"]["workloads"] == 1
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["workload"] for t in table] == ["gemm", "rmsnorm"]
    assert float(table[0]["best_speedup"]) == pytest.approx(rows["gemm"]["best_speedup"])
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The same command again: both workloads are read back, not run.
    saved = {n: (out / "workloads" / f"{n}.json").stat().st_mtime_ns for n in rows}
    p = cli(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert {n: (out / "workloads" / f"{n}.json").stat().st_mtime_ns for n in rows} == saved
    assert json.loads((out / "results.json").read_text())["rows"] == data["rows"]
    # A row saved by other code (another version of the package, say) is run again.
    stale = json.loads((out / "workloads" / "rmsnorm.json").read_text())
    stale["versions"]["code"] = "0" * 64
    (out / "workloads" / "rmsnorm.json").write_text(json.dumps(stale))
    p = cli(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((out / "workloads" / "rmsnorm.json").read_text())["versions"]["code"] != "0" * 64
    assert (out / "workloads" / "gemm.json").stat().st_mtime_ns == saved["gemm"]
    # A different spec (more steps) is not mistaken for the saved one.
    p = cli("bench", "--workloads", "rmsnorm", "--policy", "greedy", "--steps", "3", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((out / "workloads" / "rmsnorm.json").read_text())["row"]["steps"] == 3


def test_timing_only_checks_each_fast_schedule_once():
    """A search out of moves re-proposes its best; the check goes on to the next schedule.
    Schedules that differ only in knobs they leave unused (``inert``) are one program."""
    from action_space.schedule import Knob, ScheduleSpace

    class Failing:
        seen = []

        def evaluate(self, candidate):
            self.seen.append(candidate.schedule)
            return type("R", (), {"ok": False, "error": "wrong result", "speedup": None})()

    space = ScheduleSpace([Knob("block", (1, 2, 3, 4), 1), Knob("pad", (0, 1), 0)], inert=lambda s: {"pad"})
    env = type("Env", (), {"evaluator": Failing(), "schedule_space": space,
                           "workload": type("W", (), {"template_source": lambda: "x"})})()
    a, b, c, d = ({"block": v, "pad": 0} for v in (1, 2, 3, 4))
    found = [(2.0, a), (2.0, dict(a)), (1.95, {**a, "pad": 1}), (1.9, b), (1.9, b), (1.5, c), (1.2, d)]
    out = suite._check_best(env, found)
    assert Failing.seen == [a, b, c] and [f["schedule"] for f in out["check_failures"]] == [a, b, c]
    assert out["best_speedup"] is None


def test_timing_only_bench_checks_the_fastest_schedule_it_reports(cli, tmp_path):
    out = tmp_path / "fast"
    p = cli("bench", "--workloads", "gemm", "--config", GEMM, "--policy", "greedy", "--steps", "2",
            "--timing-only", "--no-experts", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "workloads" / "gemm.json").read_text())
    row, records = result["row"], result["records"]
    assert result["spec"]["timing_only"] and all(r["correct"] is None for r in records)  # explored unchecked
    assert row["check_failures"] == [] and row["best_speedup"] == pytest.approx(row["best_unchecked_speedup"])
    fastest = max([(row["start_speedup"], None)] + [(r["speedup"], r["schedule"]) for r in records],
                  key=lambda f: f[0])
    assert fastest[0] == pytest.approx(row["best_speedup"])
    assert fastest[1] is None or row["best_schedule"] == fastest[1]


# --- a real two-node Ray cluster -------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    """The live processes (zombies are dead: only their entry waits to be reaped) of session ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
                if os.getsid(int(entry)) == sid and state != "Z":
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _signal_sessions(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        for pid in _session_pids(p.pid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def _wait_sessions(procs: list[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_session_pids(p.pid) for p in procs):
        time.sleep(0.5)


def _stop(procs: list[subprocess.Popen]) -> list[int]:
    """Stop every process of the sessions these ``ray start`` processes lead (and nothing else:
    not ``ray stop``, which ends every Ray process on the machine); returns those still alive."""
    _signal_sessions(procs, signal.SIGTERM)
    _wait_sessions(procs, 10)  # a SIGTERM'd node drains for up to 30 s: no need to wait for that
    _signal_sessions(procs, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    _wait_sessions(procs, 10)
    return [pid for p in procs for pid in _session_pids(p.pid)]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one Ray user at a time
def test_bench_across_a_two_node_ray_cluster(cli, tmp_path):
    pytest.importorskip("ray")
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    short = tempfile.mkdtemp(prefix="jbray-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    common = ["--block", "--num-cpus=1", "--disable-usage-stats", f"--temp-dir={short}"]
    procs = []
    try:
        head_log = open(tmp_path / "head.log", "w")
        procs.append(subprocess.Popen([ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
                                       *common], env=env, stdout=head_log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(n['Alive'] for n in ray.nodes()))")
        nodes = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(procs) == 1 and "--block" in (tmp_path / "head.log").read_text():
                node_log = open(tmp_path / "node.log", "w")
                procs.append(subprocess.Popen([ray, "start", f"--address=127.0.0.1:{port}", *common], env=env,
                                              stdout=node_log, stderr=subprocess.STDOUT, start_new_session=True))
            if len(procs) == 2:
                q = subprocess.run([sys.executable, "-c", probe, f"127.0.0.1:{port}"], env=env, capture_output=True,
                                   text=True, timeout=60)
                nodes = int(q.stdout.strip().splitlines()[-1]) if q.returncode == 0 and q.stdout.strip() else 0
                if nodes == 2:
                    break
            assert all(p.poll() is None for p in procs), (tmp_path / "head.log").read_text()[-2000:]
            time.sleep(1)
        assert nodes == 2, "the two-node cluster did not come up"

        out = tmp_path / "run"
        shared = tmp_path / "shared-cache"  # both nodes on one directory: the cache must take it
        p = subprocess.run([sys.executable, "-m", "jaxbench_env", "bench", "--workloads", "gemm,rmsnorm", "--config",
                            GEMM, "--policy", "greedy", "--steps", "1", "--no-experts", "--out", str(out),
                            "--cache-dir", str(shared), "--ray-address", f"127.0.0.1:{port}"],
                           env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        rows = json.loads((out / "results.json").read_text())["rows"]
        assert [r["error"] for r in rows] == [None, None]
        assert all(r["best_speedup"] > 0 and r["steps"] == 1 for r in rows)
        assert len({r["node"] for r in rows}) == 2  # one CPU per node, one task each: both nodes worked
        assert any(shared.rglob("*.json"))  # the results were cached in the shared directory
    finally:
        left = _stop(procs)
        shutil.rmtree(short, ignore_errors=True)
    assert left == [], f"processes of the test's Ray cluster left running: {left}"
