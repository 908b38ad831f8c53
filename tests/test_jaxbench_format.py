"""JAXBench's own files evaluate unchanged. The modules in ``tests/jaxbench_format`` follow
JAXBench's layout, signatures and formulations (``benchmark/<id>_<name>/baseline.py`` and
the experts' ``optimized.py``; written in this project from those facts). A baseline is
judged correct at exactly the XLA baseline's predicted time (the workload's reference is
JAXBench's program, op for op); an optimized file is accepted.

Here a subset that covers each way a file can differ from this project's own candidates;
``python benchmarks/jaxbench_files.py`` runs all of them (the README quotes it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench_env.candidate import Candidate

FILES = Path(__file__).parent / "jaxbench_format"

# (folder, file): what each one exercises
CASES = [
    ("28k_convtranspose3d_layernorm_gelu_scaling", "baseline.py"),  # zero-inserted input, not lhs_dilation
    ("49k_matmul_avgpool_gelu_scale_max", "baseline.py"),  # bf16 rounding of JAXBench's own op order
    ("11p_megablox_gmm", "baseline.py"),  # JAXBench's extra static argument, max_expert_size
    ("12p_rmsnorm", "baseline.py"),  # reads its sizes from CONFIG, set to the checked size
    ("8p_gemm", "optimized.py"),  # a kernel shipped in jax, JAXBench's blocks
]


@pytest.mark.slow
@pytest.mark.parametrize("folder, file", CASES, ids=[f"{f.split('_')[0]}-{n[:-3]}" for f, n in CASES])
def test_jaxbench_files_are_judged_as_jaxbench_judges_them(evaluators, folder, file):
    import workloads

    name = next(n for n, cls in workloads.WORKLOADS.items() if folder == f"{cls.jaxbench_id}_{n}")
    ev = evaluators(name)
    result = ev.evaluate(Candidate((FILES / folder / file).read_text(), {}))
    assert result.compiled and result.correct is True, result.error
    if file == "baseline.py":  # the same program as the reference: the same predicted time
        assert result.time_ms == pytest.approx(ev.baseline().time_ms, rel=1e-6)
        assert result.speedup == pytest.approx(1.0, rel=1e-6)
    else:
        assert result.speedup > 0


def test_every_workload_has_its_jaxbench_baseline_file():
    import workloads

    folders = {p.name for p in FILES.iterdir() if (p / "baseline.py").is_file()}
    assert folders == {f"{cls.jaxbench_id}_{n}" for n, cls in workloads.WORKLOADS.items()}
    experts = {p.name for p in FILES.iterdir() if (p / "optimized.py").is_file()}
    assert experts == {f"{workloads.WORKLOADS[n].jaxbench_id}_{n}" for n in workloads.with_expert()}
