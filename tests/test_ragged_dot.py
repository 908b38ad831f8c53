"""ragged_dot (14p) at check size: reference vs float64 NumPy, degenerate outputs rejected,
and the Pallas template correct in interpret mode at several schedules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.ragged_dot import RaggedDot

W = RaggedDot()
CFG = W.check_config()

C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def numpy_ragged_dot(x, weights):
    """The spec's math in float64: each group's rows times that group's weights."""
    x, weights = np.asarray(x, np.float64), np.asarray(weights, np.float64)
    return np.stack([x[g] @ weights[g] for g in range(x.shape[0])])


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["num_groups"] >= 2
    assert (CFG["M"] // CFG["num_groups"]) % max(knobs["block_m"]) == 0
    assert CFG["K"] % max(knobs["block_k"]) == 0 and CFG["N"] % max(knobs["block_n"]) == 0
    # Rows per group are never grown: a config with 256 rows per group is checked with 256.
    few = RaggedDot({"num_groups": 8, "M": 2048}).check_config()
    assert few["M"] // few["num_groups"] == 256


def test_inputs_and_reference_shapes():
    x, weights = inputs(0)
    g, rows = CFG["num_groups"], CFG["M"] // CFG["num_groups"]
    assert x.shape == (g, rows, CFG["K"]) and x.dtype == jnp.bfloat16
    assert weights.shape == (g, CFG["K"], CFG["N"]) and weights.dtype == jnp.bfloat16
    out = jax.eval_shape(functools.partial(W.reference, CFG), x, weights)
    assert out.shape == (g, rows, CFG["N"]) and out.dtype == jnp.bfloat16
    full = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert full[0].shape == (8, 1024, 4096) and full[1].shape == (8, 4096, 14336)


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    expect = numpy_ragged_dot(*inputs(seed))
    assert np.allclose(expect, ref(seed), atol=W.atol, rtol=W.rtol)


def test_degenerate_outputs_fail():
    r = ref(0)
    x, weights = inputs(0)
    # x has K columns, not N, so no passthrough fits; a plausible wrong output instead:
    # every group multiplied by group 0's weights.
    wrong_group = np.einsum("gmk,kn->gmn", np.asarray(x, np.float32), np.asarray(weights[0], np.float32))
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), wrong_group):
        assert C.rejects(bad)
    assert not C.rejects(r)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {"block_m": 1024, "block_k": 1024, "block_n": 2048, "buffers": 2, "accumulator": "none"}
    assert space.check(biggest) is None  # K=4096 in one step: ~56 MiB at bf16, under the 100 MiB limit
    assert "VMEM" in RaggedDot({"dtype": "float32"}).schedule_space().check(biggest)  # ~112 MiB
    assert RaggedDot({"dtype": "float32"}).schedule_space().check({**biggest, "accumulator": "vmem"}) is None
    small = RaggedDot({"num_groups": 8, "M": 3072})  # 384 rows per group
    assert "divide" in small.schedule_space().check({**space.default(), "block_m": 256})
    with pytest.raises(ValueError):
        RaggedDot({"M": 8000})


SCHEDULES = [{"block_m": 1024, "block_k": 512, "block_n": 2048, "buffers": 1},
             {"block_m": 256, "block_k": 1024, "block_n": 512, "buffers": 1},
             {"block_m": 1024, "block_n": 1024, "accumulator": "none"}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
