"""cross_entropy (13p) at check size: reference vs float64 NumPy, near-miss losses rejected
(the label term matters with the fixed labels), and the Pallas template correct in
interpret mode at several schedules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.cross_entropy import CrossEntropy

W = CrossEntropy()
CFG = W.check_config()
V = CFG["vocab_size"]

C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


@functools.cache
def float64_parts(seed):
    """Per-token logsumexp, label logit and next column's logit (an off-by-one gather) of
    the spec's math in float64."""
    hidden, weight, labels = inputs(seed)
    logits = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64)
    top = logits.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
    rows, labels = np.arange(len(labels)), np.asarray(labels)
    return lse, logits[rows, labels], logits[rows, (labels + 1) % V]


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["batch_tokens"] % max(knobs["block_t"]) == 0
    # Like the full vocabulary, a multiple of 256 and of no larger vocab block.
    for vocab in (V, W.config["vocab_size"]):
        assert [vocab % b == 0 for b in knobs["block_v"]] == [True, True, False, False, False]


def test_inputs_and_reference_shapes():
    hidden, weight, labels = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert hidden.shape == (8192, 4096) and weight.shape == (4096, 128256) and hidden.dtype == jnp.bfloat16
    assert labels.shape == (8192,) and labels.dtype == jnp.int32
    out = jax.eval_shape(functools.partial(W.reference, CFG), *inputs(0))
    assert out.shape == () and out.dtype == jnp.float32


def test_seed0_hidden_and_weight_are_spec_and_labels_follow_the_model():
    hidden, weight, labels = inputs(0)
    k_hidden, k_weight, _ = jax.random.split(jax.random.key(42), 3)
    np.testing.assert_array_equal(np.asarray(hidden, np.float32),
                                  np.asarray(jax.random.normal(k_hidden, hidden.shape, jnp.bfloat16), np.float32))
    np.testing.assert_array_equal(np.asarray(weight, np.float32),
                                  np.asarray(jax.random.normal(k_weight, weight.shape, jnp.bfloat16) * 0.02, np.float32))
    labels = np.asarray(labels)
    assert labels.min() >= 0 and labels.max() < V
    # Sampled from each token's softmax: the label's logit is well above the average logit.
    _, picked, _ = float64_parts(0)
    assert picked.mean() > 0.3
    assert not np.array_equal(labels, np.asarray(inputs(1)[2]))


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64(seed):
    lse, picked, _ = float64_parts(seed)
    exact = np.mean(lse - picked)
    assert abs(exact - ref(seed)) <= 0.25 * (W.atol + W.rtol * abs(exact))


def test_near_misses_fail():
    r = ref(0)
    lse, _, off_by_one = float64_parts(0)
    near_misses = {
        "zero": 0.0, "one": 1.0,
        "ln(vocab)": np.log(V),  # uniform prediction
        "no label term": lse.mean(),  # logsumexp only
        "off-by-one label column": np.mean(lse - off_by_one),
    }
    for name, bad in near_misses.items():
        assert C.rejects(np.float32(bad)), name
    assert not C.rejects(r) and r.shape == ()


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    assert space.check({"block_t": 512, "block_v": 1024, "buffers": 2}) is None  # compiles for v6e
    assert space.check({"block_t": 1024, "block_v": 1024, "buffers": 2}) is None  # ~48 MiB, under 100
    assert "VMEM" in CrossEntropy({"hidden_dim": 16384}).schedule_space().check(
        {"block_t": 1024, "block_v": 2048, "buffers": 2})
    odd = CrossEntropy({"batch_tokens": 8192 + 384}).schedule_space()
    assert "does not divide" in odd.check({**space.default(), "block_t": 512})
    with pytest.raises(ValueError):
        CrossEntropy({"vocab_size": 128000 + 1})


SCHEDULES = [{"block_t": 1024, "block_v": 256, "buffers": 1}, {"block_t": 128, "block_v": 2048, "buffers": 1},
             {"block_t": 1024, "block_v": 1024, "buffers": 2}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
