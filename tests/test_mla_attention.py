"""mla_attention (3p) at check size: inputs, reference vs float64 NumPy, degenerate and
plausibly wrong outputs rejected, the schedule space's rules, and the Pallas template and
the expert correct in interpret mode."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_expert_correct, assert_template_correct, schedule_id
from workloads import WORKLOADS
from workloads.mla_attention import MLAAttention

W = MLAAttention()
CFG = W.check_config()
C = AtCheckSize(W)


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def numpy_mla(cfg, x, q_down, q_up, kv_down, k_up, v_up, o_proj, rope=True, causal=True):
    """The spec's math in float64 (``rope``/``causal`` False: a kernel that forgets them)."""
    x, q_down, q_up, kv_down, k_up, v_up, o_proj = map(f64, (x, q_down, q_up, kv_down, k_up, v_up, o_proj))
    B, S, _ = x.shape
    H, kvl, r = cfg["num_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    q = (x @ q_down @ q_up).reshape(B, S, H, 128 + r)
    kv = x @ kv_down
    k_nope = (kv[..., :kvl] @ k_up).reshape(B, S, H, 128)
    v = (kv[..., :kvl] @ v_up).reshape(B, S, H, 128)
    angle = np.arange(S)[:, None] * cfg["rope_theta"] ** (-np.arange(0, r, 2) / r)[None, :]
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]

    def rotate(t):
        a, b = t[..., : r // 2], t[..., r // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1) if rope else t

    k_rope = rotate(np.broadcast_to(kv[:, :, None, kvl:], (B, S, H, r)))
    qh = np.concatenate([q[..., :128], rotate(q[..., 128:])], axis=-1).transpose(0, 2, 1, 3)
    kh = np.concatenate([k_nope, k_rope], axis=-1).transpose(0, 2, 1, 3)
    s = qh @ np.swapaxes(kh, -1, -2) / np.sqrt(128 + r)
    if causal:
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3).reshape(B, S, H * 128) @ o_proj


def test_registered_and_check_size_keeps_structure():
    assert WORKLOADS["mla_attention"] is MLAAttention
    assert CFG == {**W.defaults, "batch": 2, "num_heads": 2, "emb_dim": 1024, "q_lora_rank": 256,
                   "kv_lora_rank": 128}
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["seq_len"] % max(knobs["block_q"]) == 0 and CFG["seq_len"] % max(knobs["block_k"]) == 0
    assert CFG["seq_len"] % 2048 == 0  # the expert's tuned blocks
    full = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert [x.shape for x in full] == [(4, 2048, 7168), (7168, 1536), (1536, 24576), (7168, 576),
                                       (512, 16384), (512, 16384), (16384, 7168)]
    assert all(x.dtype == jnp.bfloat16 for x in full)
    out = jax.eval_shape(functools.partial(W.reference, W.config), *full)
    assert out.shape == (4, 2048, 7168) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs_scaled_at_check_size():
    keys = jax.random.split(jax.random.key(42), 8)
    x, q_down, *_, o_proj = C.inputs(0)
    np.testing.assert_array_equal(f64(x), f64(jax.random.normal(keys[0], (2, 2048, 1024), jnp.bfloat16)))
    # Weights: N·0.02 scaled by sqrt(full fan-in / fan-in), here sqrt(7168/1024) and sqrt(16384/256).
    expect = jax.random.normal(keys[1], (1024, 256), jnp.bfloat16) * (0.02 * math.sqrt(7))
    np.testing.assert_array_equal(f64(q_down), f64(expect))
    np.testing.assert_array_equal(f64(o_proj), f64(jax.random.normal(keys[6], (256, 1024), jnp.bfloat16) * 0.16))
    # At the full size every factor is exactly the spec's 0.02.
    for fan_in in ("emb_dim", "q_lora_rank", "kv_lora_rank", "o_proj"):
        assert W.weight_scale(W.config, fan_in) == 0.02
    assert not np.array_equal(f64(C.inputs(1)[0]), f64(x))


def test_reference_matches_float64():
    exact = numpy_mla(CFG, *C.inputs(0))
    ratio = np.abs(exact - C.ref(0)) / (W.atol + W.rtol * np.abs(exact))
    # The reference's bf16 scores and softmax use most of the tolerance: a kernel computing
    # them in f32 still passes, with little to spare.
    assert ratio.max() < 0.9


def test_degenerate_and_wrong_outputs_fail():
    inputs, ref = C.inputs(0), C.ref(0)
    assert ref.std() > 5 * W.atol  # full-size magnitudes, thanks to the weight scaling
    assert not C.rejects(ref)
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f64(inputs[0])):
        assert C.rejects(bad)
    assert C.rejects(numpy_mla(CFG, *inputs, rope=False))
    assert C.rejects(numpy_mla(CFG, *inputs, causal=False))


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {"block_q": 2048, "block_k": 2048, "buffers": 2, "kv_index_map": "plain"}
    assert space.check(biggest) is None
    wide = MLAAttention({"qk_nope_head_dim": 2048, "v_head_dim": 2048}).schedule_space()
    assert "VMEM" in wide.check(biggest)
    odd = MLAAttention({"seq_len": 3072}).schedule_space()
    assert "does not divide" in odd.check(dict(odd.default(), block_q=2048))
    for bad in ({"seq_len": 1000}, {"qk_rope_head_dim": 63}, {"v_head_dim": 96}, {"num_heads": 0}):
        with pytest.raises(ValueError):
            MLAAttention(bad)


SCHEDULES = [
    {"block_q": 2048, "block_k": 1024, "kv_index_map": "clamp"},  # one q block, two kv blocks
    {"block_q": 256, "block_k": 2048, "buffers": 1},  # one kv block covering every q block
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_interpret():
    assert_expert_correct(W)
