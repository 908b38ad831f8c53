"""gqa_attention (2p) at check size: inputs, reference vs float64 NumPy, degenerate and
wrong-grouping outputs rejected, the schedule space, and the Pallas template and the
splash expert correct in interpret mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from harness import (
    AtCheckSize,
    assert_expert_correct,
    assert_template_correct,
    schedule_id,
)

from workloads import WORKLOADS
from workloads.gqa_attention import GQAAttention

W = GQAAttention()
CFG = W.check_config()
SPACE = W.schedule_space()
C = AtCheckSize(W)


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def numpy_gqa_head(query, key, value, h):
    """The spec's math in float64 for query head h (BSHD inputs, batch 0): KV head h // group."""
    group = query.shape[2] // key.shape[2]
    q, k, v = (f32(x[0, :, hh, :]).astype(np.float64) for x, hh in ((query, h), (key, h // group), (value, h // group)))
    s = q @ k.T / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_registered_and_check_size_keeps_groups_and_tiling():
    assert WORKLOADS["gqa_attention"] is GQAAttention
    assert CFG == {"batch": 1, "seq_len": 2048, "num_query_heads": 32, "num_kv_heads": 2, "head_dim": 128,
                   "emb_dim": 4096, "dtype": "bfloat16"}
    knobs = {k.name: k.values for k in SPACE.knobs}
    assert all(CFG["seq_len"] % b == 0 for b in knobs["block_q"] + knobs["block_k"])
    assert knobs["heads_per_step"] == (1, 2, 4, 8, 16)  # all checkable: the check keeps 16 heads per group
    # Another model's grouping is kept too (Llama-3-8B: 32 query heads on 8 KV heads).
    small = GQAAttention({"num_query_heads": 32, "num_kv_heads": 8, "emb_dim": 4096}).check_config()
    assert (small["num_query_heads"], small["num_kv_heads"], small["emb_dim"]) == (8, 2, 1024)
    q, k, v = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == (4, 4096, 128, 128) and k.shape == v.shape == (4, 4096, 8, 128)
    assert q.dtype == k.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs():
    kq, kk, kv = jax.random.split(jax.random.key(42), 3)
    q, k, v = C.inputs(0)
    np.testing.assert_array_equal(f32(q), f32(jax.random.normal(kq, (1, 2048, 32, 128), jnp.bfloat16)))
    for got, key in ((k, kk), (v, kv)):
        np.testing.assert_array_equal(f32(got), f32(jax.random.normal(key, (1, 2048, 2, 128), jnp.bfloat16)))
    assert not np.array_equal(f32(C.inputs(1)[0]), f32(q))


def test_reference_matches_float64():
    (q, k, v), ref = C.inputs(0), C.ref(0)
    assert ref.shape == q.shape and C.expected(0).ref.dtype == jnp.bfloat16
    for h in (0, 15, 16, 31):  # both ends of both KV groups
        exact = numpy_gqa_head(q, k, v, h)
        assert np.allclose(exact, ref[0, :, h], atol=W.atol, rtol=W.rtol)
        # the bf16 reference sits well inside the tolerance of the exact answer
        assert np.max(np.abs(exact - ref[0, :, h]) / (W.atol + W.rtol * np.abs(exact))) < 0.5


def test_degenerate_and_wrongly_grouped_outputs_fail():
    (q, k, v), ref = C.inputs(0), C.ref(0)
    group = q.shape[2] // k.shape[2]
    # Query head h on KV head h % num_kv_heads (jnp.tile) instead of h // group (jnp.repeat).
    interleaved = jax.nn.dot_product_attention(
        q.astype(jnp.float32), jnp.tile(k, (1, 1, group, 1)).astype(jnp.float32),
        jnp.tile(v, (1, 1, group, 1)).astype(jnp.float32), is_causal=True)
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f32(q), interleaved):
        assert C.rejects(bad)
    assert not C.rejects(ref)


def test_space_rejects_impossible_schedules():
    assert SPACE.check(SPACE.default()) is None
    # Both sides of the v6e compiler's limit at the full size:
    assert SPACE.check(dict(SPACE.default(), block_q=2048, block_k=2048, heads_per_step=1)) is None
    assert SPACE.check(dict(SPACE.default(), block_q=1024, block_k=1024, heads_per_step=4)) is None
    assert "VMEM" in SPACE.check(dict(SPACE.default(), block_q=1024, block_k=2048, heads_per_step=4))
    assert "VMEM" in SPACE.check(dict(SPACE.default(), block_q=512, block_k=2048, heads_per_step=8))
    odd = GQAAttention({"seq_len": 3072})
    assert "does not divide" in odd.schedule_space().check(dict(SPACE.default(), block_q=2048))
    eight = GQAAttention({"num_query_heads": 64, "emb_dim": 8192}).schedule_space()  # 8 query heads per KV head
    assert "not one of" in eight.check(dict(SPACE.default(), heads_per_step=16))
    for bad in ({"seq_len": 1000}, {"num_kv_heads": 5}, {"emb_dim": 8192}, {"head_dim": 64, "emb_dim": 8192}):
        with pytest.raises(ValueError):
            GQAAttention(bad)


SCHEDULES = [
    {"block_q": 2048, "block_k": 512, "heads_per_step": 2, "kv_index_map": "next_row"},  # kv blocks skipped
    {"block_q": 256, "block_k": 1024, "heads_per_step": 16, "buffers": 1, "kv_index_map": "clamp"},  # a whole group
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_interpret():
    assert_expert_correct(W)
