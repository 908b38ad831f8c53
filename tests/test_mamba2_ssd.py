"""mamba2_ssd (16p) at check size: reference vs float64 NumPy, degenerate outputs rejected,
the schedule space's rules, and the Pallas template correct in interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads import WORKLOADS
from workloads.mamba2_ssd import Mamba2SSD

W = Mamba2SSD()
CFG = W.check_config()
C = AtCheckSize(W)


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def numpy_ssd(q, k, v, A_log, keep=None):
    """The spec's math in float64. ``keep`` (S, S), if given, zeroes the decay where False:
    a kernel that leaves out those terms."""
    q, k, v, A_log = f64(q), f64(k), f64(v), f64(A_log)
    seq = q.shape[2]
    c = np.cumsum(np.log(1.0 / (1.0 + np.exp(-A_log)) + 1e-8), axis=-1)
    below = np.tril(np.ones((seq, seq), bool)) if keep is None else np.tril(keep)
    L = np.exp(np.where(below, c[..., :, None] - c[..., None, :], -np.inf))
    p = (q @ np.swapaxes(k, -1, -2)) * L
    r = p.sum(-1, keepdims=True)
    r = np.where(np.abs(r) < 1e-6, 1.0, r)
    return (p / np.maximum(np.abs(r), 1.0)) @ v


def test_registered_and_check_size_keeps_tiling():
    assert WORKLOADS["mamba2_ssd"] is Mamba2SSD
    assert CFG == {**W.defaults, "batch": 1, "num_heads": 2, "seq_len": 2048}
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["seq_len"] % max(knobs["block_q"]) == 0 and CFG["seq_len"] % max(knobs["block_k"]) == 0
    q, k, v, A_log = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == k.shape == v.shape == (4, 64, 4096, 64) and q.dtype == jnp.bfloat16
    assert A_log.shape == (4, 64, 4096) and A_log.dtype == jnp.float32
    out = jax.eval_shape(functools.partial(W.reference, W.config), q, k, v, A_log)
    assert out.shape == (4, 64, 4096, 64) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs():
    keys = jax.random.split(jax.random.key(42), 5)
    shape = (1, 2, 2048, 64)
    q, k, v, A_log = C.inputs(0)
    for got, key in ((q, keys[0]), (k, keys[1]), (v, keys[2])):
        np.testing.assert_array_equal(f64(got), f64(jax.random.normal(key, shape, jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(A_log), np.asarray(jax.random.normal(keys[3], shape[:3]) * 0.5 - 4.0))
    assert not np.array_equal(f64(C.inputs(1)[0]), f64(q))


def test_reference_matches_float64():
    exact = numpy_ssd(*C.inputs(0))
    ratio = np.abs(exact - C.ref(0)) / (W.atol + W.rtol * np.abs(exact))
    assert ratio.max() < 0.5


def test_degenerate_outputs_fail():
    q, k, v, A_log = C.inputs(0)
    ref = C.ref(0)
    assert not C.rejects(ref)
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f64(v)):
        assert C.rejects(bad)
    # The strong decay (~50x per position) makes P nearly diagonal, yet a kernel that keeps
    # only the diagonal, or only each 512-row diagonal block, still fails.
    pos = np.arange(CFG["seq_len"])
    assert C.rejects(numpy_ssd(q, k, v, A_log, keep=pos[:, None] == pos[None, :]))
    assert C.rejects(numpy_ssd(q, k, v, A_log, keep=pos[:, None] // 512 == pos[None, :] // 512))


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {**space.default(), "block_q": 2048, "block_k": 2048}
    assert space.check(biggest) is None  # compiles for v6e at the full size
    assert "VMEM" in Mamba2SSD({"head_dim": 4096}).schedule_space().check(biggest)
    odd = Mamba2SSD({"seq_len": 3072}).schedule_space()
    assert "does not divide" in odd.check(dict(odd.default(), block_k=2048))
    for bad in ({"seq_len": 1000}, {"head_dim": 100}, {"batch": 0}, {"dtype": "int8"}):
        with pytest.raises(ValueError):
            Mamba2SSD(bad)


SCHEDULES = [
    {"block_q": 2048, "block_k": 256, "kv_index_map": "clamp"},  # one q block, many kv blocks
    {"block_q": 128, "block_k": 1024, "buffers": 1},  # kv blocks wider than q blocks, many skipped
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
