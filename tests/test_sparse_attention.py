"""sparse_attention (4p) at check size: inputs (and their fix), reference vs float64 NumPy,
degenerate and wrong-grouping outputs rejected, the schedule space, and the Pallas
template and the splash expert correct in interpret mode."""

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
from workloads.sparse_attention import SparseAttention

W = SparseAttention()
CFG = W.check_config()
SPACE = W.schedule_space()
C = AtCheckSize(W)


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def numpy_sparse_head(q, k, v, h):
    """The spec's math in float64 for query head h of batch 0: KV head h // group, no scale."""
    group = q.shape[1] // k.shape[1]
    qh, kh, vh = (f32(x[0, hh]).astype(np.float64) for x, hh in ((q, h), (k, h // group), (v, h // group)))
    s = qh @ kh.T
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ vh


def bhsd_attention(q, k, v, keep=None):
    """Unscaled causal attention via jax.nn.dot_product_attention (BSHD) in f32, KV heads
    already matched to the query heads; ``keep`` (S, S) masks keys further."""
    out = jax.nn.dot_product_attention(*(x.astype(jnp.float32).transpose(0, 2, 1, 3) for x in (q, k, v)),
                                       mask=keep, scale=1.0, is_causal=True)
    return out.transpose(0, 2, 1, 3)


def without_one_kv_block(q, k, v):
    """A plausible tiling bug: queries 1536.. skip keys 512..1023 (an off-diagonal block)."""
    rows, cols = np.arange(q.shape[2])[:, None], np.arange(q.shape[2])[None, :]
    return bhsd_attention(q, k, v, keep=~((rows >= 1536) & (cols >= 512) & (cols < 1024)))


def test_registered_and_check_size_keeps_groups_and_tiling():
    assert WORKLOADS["sparse_attention"] is SparseAttention
    assert CFG == {"batch": 1, "seq_len": 2048, "num_query_heads": 16, "num_kv_heads": 2, "head_dim": 128,
                   "dtype": "bfloat16"}
    knobs = {k.name: k.values for k in SPACE.knobs}
    assert all(CFG["seq_len"] % b == 0 for b in knobs["block_q"] + knobs["block_k"])
    assert knobs["heads_per_step"] == (1, 2, 4, 8) == W.schedule_space(CFG).knobs[2].values
    q, k, v = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == (4, 64, 4096, 128) and k.shape == v.shape == (4, 8, 4096, 128)
    assert q.dtype == k.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs_with_the_kv_fix():
    kq, kk, kv = jax.random.split(jax.random.key(42), 3)
    q, k, v = C.inputs(0)
    prescaled = jax.random.normal(kq, (1, 16, 2048, 128), jnp.bfloat16) * 128**-0.5
    np.testing.assert_array_equal(f32(q), f32(prescaled))
    # k and v are the spec's draws without its ·0.02 (see the module docstring)
    for got, key in ((k, kk), (v, kv)):
        np.testing.assert_array_equal(f32(got), f32(jax.random.normal(key, (1, 2, 2048, 128), jnp.bfloat16)))
    assert not np.array_equal(f32(C.inputs(1)[0]), f32(q))


def test_reference_matches_float64():
    (q, k, v), ref = C.inputs(0), C.ref(0)
    assert ref.shape == q.shape and C.expected(0).ref.dtype == jnp.bfloat16
    for h in (0, 7, 8, 15):  # both ends of both KV groups
        exact = numpy_sparse_head(q, k, v, h)
        assert np.allclose(exact, ref[0, h], atol=W.atol, rtol=W.rtol)
        # bf16 rounding of scores and probabilities leaves a correct kernel a margin
        assert np.max(np.abs(exact - ref[0, h]) / (W.atol + W.rtol * np.abs(exact))) < 0.75


def test_degenerate_and_wrong_outputs_fail():
    (q, k, v), ref = C.inputs(0), C.ref(0)
    group = q.shape[1] // k.shape[1]
    repeated = [jnp.repeat(x, group, axis=1) for x in (k, v)]
    interleaved = bhsd_attention(q, *(jnp.tile(x, (1, group, 1, 1)) for x in (k, v)))  # h -> h % num_kv_heads
    for bad in (np.zeros_like(ref), np.full_like(ref, 1.0), np.full_like(ref, ref.mean()), f32(q), interleaved,
                without_one_kv_block(q, *repeated)):
        assert C.rejects(bad)
    assert not C.rejects(ref)
    # With JAXBench's k, v ~ N·0.02 the kernel that skips a kv block would pass.
    small = [x * 0.02 for x in repeated]
    assert np.allclose(without_one_kv_block(q, *small), bhsd_attention(q, *small), atol=W.atol, rtol=W.rtol)


def test_space_rejects_impossible_schedules():
    assert SPACE.check(SPACE.default()) is None
    # Both sides of the v6e compiler's limit at the full size:
    assert SPACE.check(dict(SPACE.default(), block_q=2048, block_k=2048, heads_per_step=1)) is None
    assert SPACE.check(dict(SPACE.default(), block_q=1024, block_k=1024, heads_per_step=4)) is None
    assert "VMEM" in SPACE.check(dict(SPACE.default(), block_q=1024, block_k=2048, heads_per_step=4))
    odd = SparseAttention({"seq_len": 3072})
    assert "does not divide" in odd.schedule_space().check(dict(SPACE.default(), block_q=2048))
    four = SparseAttention({"num_query_heads": 32}).schedule_space()  # 4 query heads per KV head
    assert "not one of" in four.check(dict(SPACE.default(), heads_per_step=8))
    for bad in ({"seq_len": 1000}, {"num_kv_heads": 5}, {"head_dim": 64}, {"batch": 0}):
        with pytest.raises(ValueError):
            SparseAttention(bad)


SCHEDULES = [
    {"block_q": 2048, "block_k": 256, "heads_per_step": 2, "kv_index_map": "next_row"},  # kv blocks skipped
    {"block_q": 256, "block_k": 1024, "heads_per_step": 8, "buffers": 1, "kv_index_map": "clamp"},  # a whole group
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_interpret():
    assert_expert_correct(W)
