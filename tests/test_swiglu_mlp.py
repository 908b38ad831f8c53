"""swiglu_mlp (9p) at check size: reference vs float64 NumPy, degenerate outputs rejected,
and the Pallas template correct in interpret mode at several schedules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.swiglu_mlp import SwiGLUMLP

W = SwiGLUMLP()
CFG = W.check_config()


def f32(a):
    return np.asarray(a, dtype=np.float32)


C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def numpy_swiglu(x, gate, up, down):
    """The spec's math in float64, with no intermediate rounding."""
    x, gate, up, down = (np.asarray(a, np.float64) for a in (x, gate, up, down))
    a = x @ gate
    return (a / (1.0 + np.exp(-a)) * (x @ up)) @ down


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["batch"] * CFG["seq_len"] % max(knobs["block_tokens"]) == 0
    assert CFG["mlp_dim"] % max(knobs["block_mlp"]) == 0
    assert CFG["emb_dim"] % max(knobs["block_emb"]) == 0


def test_inputs_and_reference_shapes():
    x, gate, up, down = inputs(0)
    e, f = CFG["emb_dim"], CFG["mlp_dim"]
    assert x.shape == (CFG["batch"], CFG["seq_len"], e) and x.dtype == jnp.bfloat16
    assert gate.shape == up.shape == (e, f) and down.shape == (f, e)
    assert all(a.dtype == jnp.bfloat16 for a in (gate, up, down))
    out = jax.eval_shape(functools.partial(W.reference, CFG), x, gate, up, down)
    assert out.shape == x.shape and out.dtype == jnp.bfloat16
    assert abs(float(jnp.std(gate.astype(jnp.float32))) - 0.02) < 0.001


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    expect = numpy_swiglu(*inputs(seed))
    assert np.allclose(expect, ref(seed), atol=W.atol, rtol=W.rtol)


def test_degenerate_outputs_fail():
    r = ref(0)
    x = inputs(0)[0]
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), f32(x)):
        assert C.rejects(bad)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    largest = {"block_tokens": 1024, "block_mlp": 1024, "block_emb": 2048, "buffers": 2, "accumulator": "vmem"}
    assert space.check(largest) is None  # under the template's 100 MiB scoped limit
    assert "VMEM" in space.check({**largest, "accumulator": "none"})  # x and gate/up with all 8192 of emb_dim
    assert space.check({**largest, "block_mlp": 512, "accumulator": "none"}) is None
    small = SwiGLUMLP({"batch": 1, "seq_len": 384})
    assert "divide" in small.schedule_space().check({**space.default(), "block_tokens": 256})
    with pytest.raises(ValueError):
        SwiGLUMLP({"mlp_dim": 1000})


SCHEDULES = [{"block_tokens": 1024, "block_mlp": 1024, "block_emb": 512, "buffers": 1},
             {"block_tokens": 256, "block_mlp": 512, "block_emb": 1024, "buffers": 1},
             {"block_tokens": 512, "block_mlp": 256, "block_emb": 512, "buffers": 2, "accumulator": "none"}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
