"""triangle_multiplication (17p) at check size: reference vs float64 NumPy, degenerate and
wrong-direction outputs rejected, and the Pallas template correct in interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.triangle_multiplication import TriangleMultiplication

W = TriangleMultiplication()
CFG = W.check_config()
N, CH = CFG["N"], CFG["C"]

C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def numpy_triangle(pair_act, mask, left_proj, right_proj, left_gate, right_gate, center_scale, out_proj, out_gate,
                   incoming=False):
    """The spec's math in float64 (``incoming``: T[i, j] = sum_k L[k, i] R[k, j] instead)."""
    pair_act, mask, left_proj, right_proj, left_gate, right_gate, center_scale, out_proj, out_gate = (
        np.asarray(x, np.float64) for x in (pair_act, mask, left_proj, right_proj, left_gate, right_gate,
                                            center_scale, out_proj, out_gate))
    act = pair_act * mask
    left = (act @ left_proj) * sigmoid(act @ left_gate)
    right = (act @ right_proj) * sigmoid(act @ right_gate)
    left_c, right_c = left.transpose(2, 0, 1), right.transpose(2, 0, 1)  # per-channel matmuls
    t_c = left_c.transpose(0, 2, 1) @ right_c if incoming else left_c @ right_c.transpose(0, 2, 1)
    t = t_c.transpose(1, 2, 0)
    t = t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + 1e-6) * center_scale
    return (t @ out_proj) * sigmoid(pair_act @ out_gate)


@functools.cache
def exact(seed):
    return numpy_triangle(*inputs(seed))


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG == {"N": 256, "C": 128, "direction": "outgoing", "dtype": "bfloat16"}
    assert all(N % b == 0 for name in ("block_i", "block_j", "block_k") for b in knobs[name] if b <= N)
    assert max(knobs["block_i"]) == 512 and W.config["N"] % 512 == 0  # capped at N=256 when checked
    assert (N * N) % max(knobs["block_rows"]) == 0 and CH % max(knobs["block_c"]) == 0


def test_inputs_and_reference_shapes():
    full = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert [x.shape for x in full] == [(1536, 1536, 128), (1536, 1536, 1)] + [(128, 128)] * 4 + [(128,)] + [
        (128, 128)] * 2
    assert all(x.dtype == jnp.bfloat16 for x in full)
    out = jax.eval_shape(functools.partial(W.reference, CFG), *inputs(0))
    assert out.shape == (N, N, CH) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs():
    keys = jax.random.split(jax.random.key(42), 9)
    got = inputs(0)
    expect = {0: jax.random.normal(keys[0], (N, N, CH), jnp.bfloat16),
              2: jax.random.normal(keys[1], (CH, CH), jnp.bfloat16) * 0.02,
              6: jax.random.normal(keys[5], (CH,), jnp.bfloat16) * 0.1 + 1.0,
              8: jax.random.normal(keys[7], (CH, CH), jnp.bfloat16) * 0.02}
    for i, want in expect.items():
        np.testing.assert_array_equal(np.asarray(got[i], np.float32), np.asarray(want, np.float32))
    assert np.all(np.asarray(got[1]) == 1)  # the mask
    assert not np.array_equal(np.asarray(inputs(1)[0], np.float32), np.asarray(got[0], np.float32))


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    expect = exact(seed)
    assert np.allclose(expect, ref(seed), atol=W.atol, rtol=W.rtol)
    # The bf16 reference sits well inside the tolerance of the exact answer.
    assert np.max(np.abs(expect - ref(seed)) / (W.atol + W.rtol * np.abs(expect))) < 0.5


def test_degenerate_outputs_fail():
    r = ref(0)
    pair_act = np.asarray(inputs(0)[0], np.float32)
    incoming = numpy_triangle(*inputs(0), incoming=True)
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), pair_act, incoming):
        assert C.rejects(bad)
    assert not C.rejects(r)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    big = {**space.default(), "block_c": 4, "block_i": 512, "block_j": 512, "block_k": 512}
    assert space.check(big) is None  # compiles for v6e at the full size
    assert "VMEM" in space.check({**big, "block_c": 16})
    odd = TriangleMultiplication({"N": 1408}).schedule_space()  # 11 * 128
    assert odd.check(space.default()) is None  # 128-blocks divide it
    assert "does not divide" in odd.check({**space.default(), "block_i": 256})
    for bad in ({"N": 1000}, {"C": 100}, {"direction": "incoming"}):
        with pytest.raises(ValueError):
            TriangleMultiplication(bad)


SCHEDULES = [
    {"block_rows": 4096, "block_c": 16, "block_i": 128, "block_j": 256, "block_k": 128, "buffers": 1},
    {"block_rows": 4096, "block_c": 4, "block_i": 512, "block_j": 512, "block_k": 512},  # capped at N=256
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
