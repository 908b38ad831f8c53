"""retnet_retention (15p) at check size: reference vs float64 NumPy, degenerate outputs
rejected, the schedule space's rules, and the Pallas template correct in interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads import WORKLOADS
from workloads.retnet_retention import RetNetRetention

W = RetNetRetention()
CFG = W.check_config()
C = AtCheckSize(W)


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def numpy_retention(q, k, v, gammas):
    """The spec's math in float64: γ_h^(i-j) decay below the diagonal, rows over max(Σ|A|, 1)."""
    q, k, v = f64(q), f64(k), f64(v)
    seq = q.shape[2]
    distance = np.arange(seq)[:, None] - np.arange(seq)[None, :]
    decay = np.where(distance >= 0, gammas[:, None, None] ** np.maximum(distance, 0), 0.0)
    a = (q @ np.swapaxes(k, -1, -2)) * decay
    return (a / np.maximum(np.abs(a).sum(-1, keepdims=True), 1.0)) @ v


SPEC_GAMMAS = 1.0 - 2.0 ** (-5.0 - np.arange(16))


def test_registered_and_check_size_keeps_tiling():
    assert WORKLOADS["retnet_retention"] is RetNetRetention
    assert CFG == {**W.defaults, "batch": 1, "seq_len": 1024}
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["seq_len"] % max(knobs["block_q"]) == 0 and CFG["seq_len"] % max(knobs["block_k"]) == 0
    full = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert all(x.shape == (4, 16, 4096, 256) and x.dtype == jnp.bfloat16 for x in full)
    out = jax.eval_shape(functools.partial(W.reference, W.config), *full)
    assert out.shape == (4, 16, 4096, 256) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs():
    keys = jax.random.split(jax.random.key(42), 3)
    shape = (1, 16, 1024, 256)
    for got, key in zip(C.inputs(0), keys):
        np.testing.assert_array_equal(f64(got), f64(jax.random.normal(key, shape, jnp.bfloat16)))
    assert not np.array_equal(f64(C.inputs(1)[0]), f64(C.inputs(0)[0]))


def test_reference_matches_float64():
    exact = numpy_retention(*C.inputs(0), SPEC_GAMMAS)
    ratio = np.abs(exact - C.ref(0)) / (W.atol + W.rtol * np.abs(exact))
    # the bf16 cast of the normalised scores keeps the reference well inside the tolerance
    assert ratio.max() < 0.5


def test_degenerate_outputs_fail():
    q, k, v = C.inputs(0)
    ref = C.ref(0)
    assert not C.rejects(ref)
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f64(v)):
        assert C.rejects(bad)
    # Plausible wrong kernels: the heads' decays in reverse order, and no decay at all.
    assert C.rejects(numpy_retention(q, k, v, SPEC_GAMMAS[::-1]))
    assert C.rejects(numpy_retention(q, k, v, np.ones(16)))


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {"block_q": 1024, "block_k": 1024, "buffers": 2, "kv_index_map": "plain"}
    assert space.check(biggest) is None  # compiles for v6e at the full size
    assert "VMEM" in RetNetRetention({"head_dim": 4096}).schedule_space().check(biggest)
    odd = RetNetRetention({"seq_len": 1536}).schedule_space()
    assert "does not divide" in odd.check(dict(odd.default(), block_q=1024))
    for bad in ({"seq_len": 1000}, {"head_dim": 192}, {"num_heads": 0}, {"dtype": "int8"}):
        with pytest.raises(ValueError):
            RetNetRetention(bad)


SCHEDULES = [
    # Blocks of at most half the check size's 1024 positions: two or more steps on each grid
    # axis, so the check runs at the first rung instead of climbing the ladder.
    {"block_q": 512, "block_k": 128, "kv_index_map": "clamp"},  # several kv blocks per q block, skipped ones
    {"block_q": 128, "block_k": 512, "buffers": 1},  # one kv block wider than the q block
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
