"""Kernels written against earlier jax releases' Pallas names evaluate unchanged, and a name
this jax lacks gets an error naming the one it has."""

from __future__ import annotations

import workloads
from conftest import SMALL_GEMM
from jaxbench_env.candidate import Candidate


def test_old_pallas_tpu_names_evaluate_unchanged(evaluators):
    wl = workloads.get("gemm", SMALL_GEMM)
    source = wl.template_source()
    assert "pltpu.CompilerParams(" in source
    old = source.replace("pltpu.CompilerParams(", "pltpu.TPUCompilerParams(")  # the name before jax 0.7.0
    result = evaluators("gemm", SMALL_GEMM).evaluate(Candidate(old, wl.schedule_space().default()))
    assert result.correct and result.compiled and result.error is None, result.error


def test_a_misspelt_pallas_name_says_which_name_this_jax_has(evaluators):
    wl = workloads.get("gemm", SMALL_GEMM)
    bad = wl.template_source().replace("pltpu.CompilerParams(", "pltpu.CompilerParameters(")
    result = evaluators("gemm", SMALL_GEMM).evaluate(Candidate(bad, wl.schedule_space().default()))
    assert not result.correct and "pltpu.CompilerParameters does not exist" in result.error
    assert "pltpu.CompilerParams" in result.error.split("does not exist", 1)[1], result.error
