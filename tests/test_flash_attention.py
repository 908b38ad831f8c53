"""flash_attention (1p): reference, check strength, and the Pallas template in interpret mode."""

from jaxbench_env.aot import prepare_process

prepare_process()  # CPU jax; a no-op for env vars when jax is already imported


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_expert_correct, assert_template_correct
from workloads import WORKLOADS
from workloads.flash_attention import FlashAttention

W = FlashAttention()
CFG = W.check_config()
SPACE = W.schedule_space()


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


C = AtCheckSize(W)


def test_registered_and_check_size():
    assert WORKLOADS["flash_attention"] is FlashAttention
    assert CFG == {"batch": 2, "seq_len": 2048, "num_heads": 2, "head_dim": 128, "dtype": "bfloat16"}
    assert all(CFG["seq_len"] % b == 0 for b in SPACE.knobs[0].values + SPACE.knobs[1].values)
    q, k, v = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == k.shape == v.shape == (4, 64, 4096, 128) and q.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs():
    kq, kk, kv = jax.random.split(jax.random.key(42), 3)
    q, k, v = W.make_inputs(CFG, 0)
    shape = (2, 2, 2048, 128)
    for got, key in ((q, kq), (k, kk), (v, kv)):
        np.testing.assert_array_equal(f32(got), f32(jax.random.normal(key, shape, jnp.bfloat16)))
    assert not np.array_equal(f32(W.make_inputs(CFG, 1)[0]), f32(q))


def test_reference_matches_float64():
    (q, k, v), ref = C.inputs(0), C.ref(0)
    q64, k64, v64 = (f32(x).astype(np.float64) for x in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(128.0)
    seq = s.shape[-1]
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    exact = p @ v64
    assert ref.shape == q.shape and C.expected(0).ref.dtype == jnp.bfloat16
    assert np.allclose(exact, f32(ref), atol=W.atol, rtol=W.rtol)
    # the bf16 reference sits well inside the tolerance of the exact answer
    assert np.max(np.abs(exact - f32(ref)) / (W.atol + W.rtol * np.abs(exact))) < 0.5


def test_degenerate_outputs_fail():
    (_, _, v), ref = C.inputs(0), C.ref(0)
    assert C.rejects(np.zeros_like(ref))
    assert C.rejects(np.full_like(ref, ref.mean()))
    assert C.rejects(f32(v))


def test_schedule_space_check():
    assert SPACE.check(SPACE.default()) is None
    big = dict(SPACE.default(), block_q=2048, block_k=2048, kv_splits=1)
    assert SPACE.check(big) is None  # compiles for v6e at the full size
    wide = FlashAttention({"head_dim": 1024}).schedule_space()  # a config whose tiles do not fit
    assert "VMEM" in wide.check(big)
    assert wide.check(dict(big, block_q=512, block_k=512)) is None
    assert "multiple of 128" in SPACE.check(dict(SPACE.default(), block_k=256, kv_splits=4))
    odd = FlashAttention({"seq_len": 3072}).schedule_space()
    assert "does not divide" in odd.check(dict(odd.default(), block_q=2048))
    with pytest.raises(ValueError):
        FlashAttention({"seq_len": 1000})


SCHEDULES = [
    {"block_q": 2048, "block_k": 2048, "kv_splits": 2, "kv_index_map": "next_row"},  # jax's tuned tiling
    {"block_q": 512, "block_k": 1024, "kv_splits": 2, "kv_index_map": "clamp"},  # sub-blocks skipped
    {"block_q": 1024, "block_k": 256, "buffers": 1, "kv_index_map": "clamp"},  # kv blocks skipped
    # The mask built on diagonal blocks only (below-diagonal sub-blocks unmasked), q pre-scaled.
    {"block_q": 256, "block_k": 512, "kv_splits": 2, "mask": "diagonal", "scale": "queries"},
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(f"{v}" for v in s.values()) or "default")
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_correct():
    # jax's shipped flash attention with the tuned 2048/2048/1024 blocks, at check size.
    assert_expert_correct(W)
