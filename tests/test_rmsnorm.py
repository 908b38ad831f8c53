"""rmsnorm (12p) at check size: reference vs float64 NumPy, degenerate outputs rejected,
and the Pallas template correct in interpret mode at several schedules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.rmsnorm import RMSNorm

W = RMSNorm()
CFG = W.check_config()


def f32(a):
    return np.asarray(a, dtype=np.float32)


C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def numpy_rmsnorm(x, scale, eps):
    """The spec's math in float64, with no intermediate rounding."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(scale, np.float64)


def test_check_size_keeps_tiling():
    assert CFG["batch"] * CFG["seq_len"] % max(W.schedule_space().knobs[0].values) == 0
    assert CFG["emb_dim"] == W.config["emb_dim"]


def test_inputs_and_reference_shapes():
    x, scale = inputs(0)
    assert x.shape == (1, CFG["seq_len"], CFG["emb_dim"]) and x.dtype == jnp.bfloat16
    assert scale.shape == (CFG["emb_dim"],) and scale.dtype == jnp.bfloat16
    out = jax.eval_shape(functools.partial(W.reference, CFG), x, scale)
    assert out.shape == x.shape and out.dtype == jnp.bfloat16
    assert abs(float(jnp.mean(scale.astype(jnp.float32))) - 1.0) < 0.02  # N*0.1 + 1


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    x, scale = inputs(seed)
    expect = numpy_rmsnorm(x, scale, CFG["epsilon"])
    assert np.allclose(expect, ref(seed), atol=W.atol, rtol=W.rtol)


def test_degenerate_outputs_fail():
    r = ref(0)
    x, _ = inputs(0)
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), f32(x)):
        assert C.rejects(bad)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    assert "VMEM" in space.check({"block_rows": 512, "buffers": 1})  # ~40 MiB at emb_dim 8192
    small = RMSNorm({"batch": 1, "seq_len": 24})
    assert "divide" in small.schedule_space().check({"block_rows": 16, "buffers": 2})
    with pytest.raises(ValueError):
        RMSNorm({"emb_dim": 1000})


SCHEDULES = [{"block_rows": 8, "buffers": 2}, {"block_rows": 256, "buffers": 1}, {"block_rows": 64, "buffers": 1}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
