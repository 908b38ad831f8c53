"""flash_attention (1p): reference, check strength, and the Pallas template in interpret mode."""

from jaxbench_env.tpu import prepare_process

prepare_process()  # CPU jax; a no-op for env vars when jax is already imported

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from workloads import WORKLOADS
from workloads.flash_attention import FlashAttention

W = FlashAttention()
CFG = W.check_config()
SPACE = W.space()


def f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def close(ref, out):
    return np.allclose(f32(ref), f32(out), atol=W.atol, rtol=W.rtol)


@pytest.fixture(scope="module")
def ref_fn():
    return jax.jit(lambda q, k, v: W.reference(CFG, q, k, v))


@pytest.fixture(scope="module")
def cases(ref_fn):
    out = []
    for seed in range(3):
        q, k, v = W.make_inputs(CFG, seed)
        out.append(((q, k, v), ref_fn(q, k, v)))
    return out


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


def test_reference_matches_float64(cases):
    (q, k, v), ref = cases[0]
    q64, k64, v64 = (f32(x).astype(np.float64) for x in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(128.0)
    seq = s.shape[-1]
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    exact = p @ v64
    assert ref.shape == q.shape and ref.dtype == jnp.bfloat16
    assert np.allclose(exact, f32(ref), atol=W.atol, rtol=W.rtol)
    # the bf16 reference sits well inside the tolerance of the exact answer
    assert np.max(np.abs(exact - f32(ref)) / (W.atol + W.rtol * np.abs(exact))) < 0.5


def test_degenerate_outputs_fail(cases):
    (q, k, v), ref = cases[0]
    assert not close(ref, jnp.zeros_like(ref))
    assert not close(ref, jnp.full_like(ref, f32(ref).mean()))
    assert not close(ref, v)


def test_schedule_space_check():
    assert SPACE.check(SPACE.default()) is None
    big = dict(SPACE.default(), block_q=2048, block_k=2048, kv_splits=1)
    assert SPACE.check(big) is None  # compiles for v6e at the full size
    wide = FlashAttention({"head_dim": 1024}).space()  # a config whose tiles do not fit
    assert "VMEM" in wide.check(big)
    assert wide.check(dict(big, block_q=512, block_k=512)) is None
    assert "multiple of 128" in SPACE.check(dict(SPACE.default(), block_k=256, kv_splits=4))
    odd = FlashAttention({"seq_len": 3072}).space()
    assert "does not divide" in odd.check(dict(odd.default(), block_q=2048))
    with pytest.raises(ValueError):
        FlashAttention({"seq_len": 1000})


SCHEDULES = [
    {},  # the template's defaults
    {"block_q": 2048, "block_k": 2048, "kv_splits": 2, "kv_index_map": "next_row"},  # jax's tuned tiling
    {"block_q": 512, "block_k": 1024, "kv_splits": 2, "kv_index_map": "clamp"},  # sub-blocks skipped
    {"block_q": 1024, "block_k": 256, "buffers": 1, "kv_index_map": "clamp"},  # kv blocks skipped
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(f"{v}" for v in s.values()) or "default")
def test_template_interpret(schedule, cases):
    full = dict(SPACE.default(), **schedule)
    assert SPACE.check(full) is None
    m = types.ModuleType("cand")
    exec(compile(W.template_source(), "<candidate>", "exec"), m.__dict__)
    assert set(m.SCHEDULE) == set(SPACE.names) and m.SCHEDULE == SPACE.default()
    m.CONFIG = CFG
    m.SCHEDULE.update(schedule)
    fn = jax.jit(m.workload)
    with pltpu.force_tpu_interpret_mode():
        for (q, k, v), ref in cases:
            out = fn(q, k, v)
            assert out.shape == ref.shape and out.dtype == ref.dtype
            assert close(ref, out)
