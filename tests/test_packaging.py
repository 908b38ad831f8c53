"""The built wheel holds everything the package reads at run time: installed (not editable)
into a fresh virtualenv, it evaluates a template from outside the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_evaluates_a_template_outside_the_tree(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("jaxbench_gym-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("workloads/templates/gemm.py", "workloads/templates/conv_family.py", "workloads/experts/gemm.py",
                 "jaxbench_env/data/sim_calibration.json", "jaxbench_env/data/jaxbench_v6e_published.csv",
                 "policies/guide/tiling_rules.md"):
        assert name in names, name

    # The dependencies (jax, libtpu, ...) come from this interpreter's site-packages; the
    # package itself only from the wheel (the check below fails if the source tree leaks in).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(py), "-c", "import jaxbench_env, workloads; print(jaxbench_env.__file__); "
                            "print(workloads.__file__)"], cwd=work, env=env, capture_output=True, text=True,
                           timeout=300, check=True).stdout.split()
    assert all(str(venv) in w for w in where), where
    p = subprocess.run([str(venv / "bin" / "jaxbench"), "evaluate", "gemm", "--config", "M=1024,K=1024,N=2048",
                        "--json", "--cache-dir", str(tmp_path / "cache")], cwd=work, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)
    assert result["compiled"] and result["correct"] and result["speedup"] > 0, result
