"""flex_attention (5p) at check size: inputs (and their fix), reference vs float64 NumPy,
degenerate and wrong-bias outputs rejected, the schedule space, and the Pallas template
correct in interpret mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from harness import AtCheckSize, assert_template_correct, schedule_id

from workloads import WORKLOADS
from workloads.flex_attention import FlexAttention

W = FlexAttention()
CFG = W.check_config()
SPACE = W.schedule_space()
C = AtCheckSize(W)


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def numpy_flex(q, k, v, rel_pos_bias, b, h):
    """The spec's math in float64 for batch element b, head h."""
    qh, kh, vh = (f32(x[b, h]).astype(np.float64) for x in (q, k, v))
    s = qh @ kh.T / np.sqrt(qh.shape[-1]) + f32(rel_pos_bias[h]).astype(np.float64)
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ vh


def biased_attention(q, k, v, bias):
    """Causal attention plus ``bias`` (broadcast to (B, H, S, S)) via jax.nn.dot_product_attention, f32."""
    out = jax.nn.dot_product_attention(*(x.astype(jnp.float32).transpose(0, 2, 1, 3) for x in (q, k, v)),
                                       bias=None if bias is None else bias.astype(jnp.float32), is_causal=True)
    return out.transpose(0, 2, 1, 3)


def test_registered_and_check_size_keeps_tiling():
    assert WORKLOADS["flex_attention"] is FlexAttention
    assert CFG == {"batch": 4, "seq_len": 2048, "num_heads": 2, "head_dim": 128, "dtype": "bfloat16"}
    knobs = {k.name: k.values for k in SPACE.knobs}
    assert all(CFG["seq_len"] % b == 0 for b in knobs["block_q"] + knobs["block_k"])
    assert knobs["batch_per_step"] == (1, 2, 4) == W.schedule_space(CFG).knobs[2].values
    q, k, v, bias = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == k.shape == v.shape == (4, 64, 4096, 128) and bias.shape == (64, 4096, 4096)
    assert q.dtype == bias.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs_with_the_scale_fix():
    kq, kk, kv, kb = jax.random.split(jax.random.key(42), 4)
    q, k, v, bias = C.inputs(0)
    shape = (4, 2, 2048, 128)
    # the spec's draws; k and the bias scaled by 0.5 rather than 0.02 and 0.01, v unscaled (docstring)
    for got, key, scale in ((q, kq, 1.0), (k, kk, 0.5), (v, kv, 1.0)):
        np.testing.assert_array_equal(f32(got), f32(jax.random.normal(key, shape, jnp.bfloat16) * scale))
    np.testing.assert_array_equal(f32(bias), f32(jax.random.normal(kb, (2, 2048, 2048), jnp.bfloat16) * 0.5))
    assert not np.array_equal(f32(C.inputs(1)[3]), f32(bias))


def test_reference_matches_float64():
    (q, k, v, bias), ref = C.inputs(0), C.ref(0)
    assert ref.shape == q.shape and C.expected(0).ref.dtype == jnp.bfloat16
    for b, h in ((0, 0), (3, 1)):
        exact = numpy_flex(q, k, v, bias, b, h)
        assert np.allclose(exact, ref[b, h], atol=W.atol, rtol=W.rtol)
        # bf16 rounding of scores and probabilities leaves a correct kernel a margin
        assert np.max(np.abs(exact - ref[b, h]) / (W.atol + W.rtol * np.abs(exact))) < 0.5


def test_degenerate_and_wrong_bias_outputs_fail():
    (q, k, v, bias), ref = C.inputs(0), C.ref(0)
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f32(q),
                biased_attention(q, k, v, None),  # bias ignored
                biased_attention(q, k, v, bias[::-1]),  # the other head's bias
                biased_attention(q, k, v, jnp.swapaxes(bias, 1, 2))):  # bias indexed (key, query)
        assert C.rejects(bad)
    assert not C.rejects(ref)
    # With JAXBench's k, v ~ N·0.02 and bias ~ N·0.01, ignoring the bias would pass.
    small = [q, k * 0.04, v * 0.02, bias * 0.02]
    assert np.allclose(biased_attention(*small[:3], None), biased_attention(*small), atol=W.atol, rtol=W.rtol)


def test_space_rejects_impossible_schedules():
    assert SPACE.check(SPACE.default()) is None
    # Both sides of the v6e compiler's limit at the full size:
    assert SPACE.check(dict(SPACE.default(), block_q=2048, block_k=512, batch_per_step=2)) is None
    assert SPACE.check(dict(SPACE.default(), block_q=1024, block_k=1024, batch_per_step=2)) is None
    assert "VMEM" in SPACE.check(dict(SPACE.default(), block_q=2048, block_k=2048))
    assert "VMEM" in SPACE.check(dict(SPACE.default(), block_q=1024, block_k=1024, batch_per_step=4))
    three = FlexAttention({"batch": 6}).schedule_space()
    assert three.knobs[2].values == (1, 2)
    odd = FlexAttention({"seq_len": 3072})
    assert "does not divide" in odd.schedule_space().check(dict(SPACE.default(), block_k=2048))
    for bad in ({"seq_len": 1000}, {"head_dim": 64}, {"num_heads": 0}):
        with pytest.raises(ValueError):
            FlexAttention(bad)


SCHEDULES = [
    {"block_q": 1024, "block_k": 512, "batch_per_step": 2, "kv_index_map": "next_row"},  # kv blocks skipped
    {"block_q": 256, "block_k": 1024, "batch_per_step": 4, "buffers": 1, "kv_index_map": "clamp"},  # whole batch
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
