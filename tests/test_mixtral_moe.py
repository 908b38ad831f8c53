"""mixtral_moe (10p) at check size: reference vs float64 NumPy, degenerate outputs rejected,
and the fused Pallas expert template correct in interpret mode at several schedules."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from workloads.mixtral_moe import MixtralMoE

W = MixtralMoE()
CFG = W.check_config()


def f32(a):
    return np.asarray(a, dtype=np.float32)


C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def numpy_moe(x, router, gate, up, down, k):
    """The spec's math in float64. Returns (routed output, dense mean over experts).

    The logits are rounded to bf16 as the spec says (routing is decided on bf16 logits);
    everything else stays in float64. Ties go to the lower expert index, as in lax.top_k.
    """
    b, s, d = x.shape
    x = np.asarray(x, np.float64).reshape(b * s, d)
    router, gate, up, down = (np.asarray(a, np.float64) for a in (router, gate, up, down))
    logits = (x @ router).astype(ml_dtypes.bfloat16).astype(np.float64)
    idx = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, idx, axis=-1)
    p = np.exp(top - top.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)
    dense = np.zeros_like(x)
    for e in range(gate.shape[0]):
        a = x @ gate[e]
        y = (a / (1.0 + np.exp(-a)) * (x @ up[e])) @ down[e]
        out += (p * (idx == e)).sum(axis=-1)[:, None] * y
        dense += y / gate.shape[0]
    return out.reshape(b, s, d), dense.reshape(b, s, d)


@functools.lru_cache(maxsize=None)
def numpy_ref(seed):
    return numpy_moe(*inputs(seed), CFG["num_experts_per_tok"])


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["batch"] * CFG["seq_len"] % max(knobs["block_tokens"]) == 0
    assert CFG["mlp_dim"] % max(knobs["block_mlp"]) == 0
    assert CFG["num_experts"] >= 2 * CFG["num_experts_per_tok"]


def test_inputs_and_reference_shapes():
    x, router, gate, up, down = inputs(0)
    b, s, d, f, e = (CFG[k] for k in ("batch", "seq_len", "emb_dim", "mlp_dim", "num_experts"))
    assert x.shape == (b, s, d) and router.shape == (d, e)
    assert gate.shape == up.shape == (e, d, f) and down.shape == (e, f, d)
    assert all(a.dtype == jnp.bfloat16 for a in (x, router, gate, up, down))
    out = jax.eval_shape(functools.partial(W.reference, CFG), x, router, gate, up, down)
    assert out.shape == (b, s, d) and out.dtype == jnp.float32


def test_reference_matches_float64_numpy():
    routed, _ = numpy_ref(0)
    assert np.allclose(routed, ref(0), atol=W.atol, rtol=W.rtol)


def test_degenerate_outputs_fail():
    r = ref(0)
    _, dense = numpy_ref(0)
    for bad in (np.zeros_like(r), np.full_like(r, r.mean()), np.full_like(r, r.std()), f32(dense)):
        assert C.rejects(bad)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    assert space.check({**space.default(), "block_tokens": 1024, "block_mlp": 256}) is None  # ~96 MiB
    assert "VMEM" in space.check({**space.default(), "block_tokens": 1024, "block_mlp": 512})  # ~110 MiB
    odd = MixtralMoE({"mlp_dim": 128 * 3})
    assert "divide" in odd.schedule_space().check({**space.default(), "block_mlp": 256})
    with pytest.raises(ValueError):
        MixtralMoE({"num_experts_per_tok": 9})


SCHEDULES = [
    {"block_tokens": 512, "block_mlp": 512, "buffers": 1},
    {"block_tokens": 128, "block_mlp": 128, "buffers": 2},
    {"block_tokens": 1024, "block_mlp": 256, "buffers": 2},
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)
