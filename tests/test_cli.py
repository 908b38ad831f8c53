"""The ``jaxbench`` command line, run as ``python -m jaxbench_env`` in a subprocess."""

from __future__ import annotations

import json

import pytest

SMALL = "M=1024,K=1024,N=2048"


def test_list_json(cli):
    p = cli("list", "--json", "--rungs")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert isinstance(rows, list) and rows
    names = {r["name"] for r in rows}
    assert "gemm" in names
    for r in rows:
        assert {"name", "jaxbench_id", "category"} <= set(r)
    gemm = next(r for r in rows if r["name"] == "gemm")
    assert gemm["jaxbench_id"] == "8p" and gemm["category"] == "matmul"
    # JAXBench's 50: 17 production workloads (1p-17p), eight of them with an expert kernel,
    # then the 33 KernelBench ones (18k-50k), in JAXBench's order.
    assert [r["jaxbench_id"] for r in rows] == [f"{i}p" for i in range(1, 18)] + [f"{i}k" for i in range(18, 51)]
    assert {r["name"] for r in rows if r["expert"]} == {
        "flash_attention", "gqa_attention", "mla_attention", "sparse_attention", "paged_attention",
        "ragged_paged_attention", "gemm", "megablox_gmm"}
    # --rungs: each workload's check-size ladder, as the dimensions each rung shrinks; every
    # rung grows toward the full size; gemm's doubles each dimension until its inputs pass the cap.
    for r in rows:
        ladder = r["check_rungs"]
        assert ladder and ladder[0], r["name"]  # rung 0 shrinks something
        for lower, upper in zip(ladder, ladder[1:]):
            assert set(upper) <= set(lower) and all(upper[k] >= lower[k] for k in upper), (r["name"], ladder)
    assert gemm["check_rungs"] == [{"M": 1024 * 2**i, "K": 1024 * 2**i, "N": 2048 * 2**i} for i in range(3)]


def test_baseline_json(cli):
    p = cli("baseline", "gemm", "--config", SMALL, "--backend", "sim", "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["workload"] == "gemm" and obj["backend"] == "sim" and obj["timing_source"] == "v6e-sim"
    assert obj["time_ms"] > 0


def test_evaluate_template_json_and_human(cli):
    p = cli("evaluate", "gemm", "--config", SMALL, "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    for key in ("workload", "backend", "timing_source", "compiled", "correct", "max_abs_err", "time_ms",
                "baseline_ms", "speedup", "error", "trusted_timing"):
        assert key in obj
    assert obj["compiled"] and obj["correct"] and obj["error"] is None and obj["trusted_timing"] is True
    # what a user quoting the number needs to judge it: the simulator's breakdown and caveats
    sim = obj["details"]["sim"]
    assert sim["kernels"][0]["steps"] > 0 and "caveats" in sim and sim["bounds"] == []
    assert obj["speedup"] == pytest.approx(obj["baseline_ms"] / obj["time_ms"])
    # Human output (now cached) says the times are predictions of the simulator.
    p = cli("evaluate", "gemm", "--config", SMALL)
    assert p.returncode == 0, p.stderr
    assert "predicted" in p.stdout and "measured" not in p.stdout


def test_evaluate_kernel_file(cli, tmp_path):
    import workloads

    src = workloads.get("gemm").template_source().replace('"block_m": 512', '"block_m": 1024')
    kernel = tmp_path / "k.py"
    kernel.write_text(src)
    p = cli("evaluate", "gemm", "--config", SMALL, "--kernel", str(kernel), "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["compiled"] and obj["correct"] and obj["speedup"] > 0


def test_optimize_random_writes_outputs(cli, tmp_path):
    out = tmp_path / "run"
    p = cli("optimize", "gemm", "--config", SMALL, "--policy", "random", "--steps", "3", "--seed", "13",
            "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("step ") >= 3  # one progress line per step
    assert "speedup" in p.stdout
    log = json.loads((out / "log.json").read_text())
    assert log["config"]["M"] == 1024 and log["policy"] == "random" and log["timing_source"] == "v6e-sim"
    assert log["start"]["speedup"] > 0 and log["start"]["schedule"]
    assert len(log["steps"]) == 3
    for n, rec in enumerate(log["steps"], 1):
        assert rec["step"] == n and rec["wall_s"] > 0 and isinstance(rec["cached"], bool)
        for key in ("action", "schedule", "reward", "speedup", "correct", "compiled", "time_ms", "error",
                    "timing_source"):
            assert key in rec
    best = (out / "best_kernel.py").read_text()
    assert "def workload(" in best and "SCHEDULE = {" in best
    compile(best, "best_kernel.py", "exec")


@pytest.mark.parametrize("args, needle", [
    (("baseline", "no_such_workload"), "no_such_workload"),
    (("evaluate", "gemm", "--config", "Q=1"), "Q"),
    (("evaluate", "gemm", "--kernel", "/no/such/kernel.py"), "kernel"),
    (("evaluate", "gemm", "--config", "M"), "KEY=VALUE"),
])
def test_bad_input_exits_2(cli, args, needle):
    p = cli(*args)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_show_describes_the_workload(cli):
    p = cli("show", "gemm", "--config", "M=1024", "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["config"]["M"] == 1024 and obj["defaults"]["M"] == 8192 and obj["expert"] == "gemm.py"
    assert [k["name"] for k in obj["knobs"]] == ["block_m", "block_k", "block_n", "buffers", "order", "accumulator"]
    assert all(k["default"] in k["values"] for k in obj["knobs"]) and obj["atol"] > 0
    p = cli("show", "ragged_paged_attention")
    assert p.returncode == 0, p.stderr
    assert "compile-checked only off-TPU" in p.stdout and "schedule knobs" in p.stdout
    assert cli("show", "nope").returncode == 2
