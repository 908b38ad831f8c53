"""megablox_gmm (11p) at check size: reference vs float64 NumPy on uniform and ragged group
sizes, degenerate and wrong-group outputs rejected, and the Pallas template and jax's
megablox expert correct in interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_expert_correct, assert_template_correct, schedule_id
from workloads.megablox_gmm import MegabloxGMM

W = MegabloxGMM()
CFG = W.check_config()
M = CFG["seq_len"] * CFG["num_experts_per_tok"]
G = CFG["num_experts"]

C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def numpy_gmm(lhs, rhs, group_sizes):
    """The general rule in float64: group g's rows start at the sum of the earlier sizes;
    rows past the total stay zero."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for g, size in enumerate(np.asarray(group_sizes).tolist()):
        out[start:start + size] = lhs[start:start + size] @ rhs[g]
        start += size
    return out


def test_check_size_keeps_tiling():
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert G >= 4 and CFG["max_expert_size"] == M // G
    assert M % max(knobs["tm"]) == 0 and CFG["emb_dim"] % max(knobs["tk"]) == 0
    assert CFG["moe_mlp_dim"] % max(knobs["tn"]) == 0


def test_inputs_and_reference_shapes():
    lhs, rhs, sizes = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert lhs.shape == (32768, 4096) and rhs.shape == (128, 4096, 1536) and lhs.dtype == jnp.bfloat16
    assert sizes.shape == (128,) and sizes.dtype == jnp.int32
    out = jax.eval_shape(functools.partial(W.reference, CFG), *inputs(0))
    assert out.shape == (M, CFG["moe_mlp_dim"]) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_and_later_seeds_are_ragged():
    lhs, rhs, sizes = inputs(0)
    k_lhs, k_rhs = jax.random.split(jax.random.key(42), 2)
    np.testing.assert_array_equal(np.asarray(lhs, np.float32),
                                  np.asarray(jax.random.normal(k_lhs, lhs.shape, jnp.bfloat16), np.float32))
    np.testing.assert_array_equal(np.asarray(rhs, np.float32),
                                  np.asarray(jax.random.normal(k_rhs, rhs.shape, jnp.bfloat16) * 0.02, np.float32))
    assert np.all(np.asarray(sizes) == M // G)
    for seed in (1, 2):
        ragged = np.asarray(inputs(seed)[2])
        assert ragged.dtype == np.int32 and (ragged == 0).any() and ragged.sum() <= M
        assert ragged.max() <= CFG["max_expert_size"] and len(set(ragged.tolist())) > 1
        assert (np.cumsum(ragged) % 128 != 0).any()  # some group boundary falls inside a row tile


@pytest.mark.parametrize("seed", (0, 1, 2))
def test_reference_matches_float64_numpy(seed):
    expect = numpy_gmm(*inputs(seed))
    assert np.allclose(expect, ref(seed), atol=W.atol, rtol=W.rtol)


def test_reference_follows_groups_near_the_end_of_lhs():
    # With a bound above M/G, a group can start within max_expert_size rows of the end:
    # JAXBench's clamped slice reads shifted rows there; the reference's window moves back.
    cfg = {**CFG, "max_expert_size": 2 * M // G}
    lhs, rhs, _ = inputs(1)
    sizes = jnp.array([M // 10, 3 * M // 10, M // 2 - 12, M // 10], jnp.int32)
    assert int(sizes[:3].sum()) > M - cfg["max_expert_size"]
    got = np.asarray(jax.jit(functools.partial(W.reference, cfg))(lhs, rhs, sizes), np.float32)
    assert np.allclose(numpy_gmm(lhs, rhs, sizes), got, atol=W.atol, rtol=W.rtol)


def test_degenerate_outputs_fail():
    r = ref(0)
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean())):
        assert C.rejects(bad)
    assert not C.rejects(r)
    # lhs has emb_dim columns, not moe_mlp_dim, so no passthrough fits; plausible wrong
    # outputs on ragged sizes instead: the uniform rule (row r in group r // (M/G)), and
    # the right groups with the rows past the total left to the last group.
    lhs, rhs = (np.asarray(x, np.float64) for x in inputs(1)[:2])
    sizes = np.asarray(inputs(1)[2])
    uniform_rule = np.einsum("gmk,gkn->gmn", lhs.reshape(G, M // G, -1), rhs).reshape(M, -1)
    unmasked_tail = numpy_gmm(lhs, rhs, sizes)
    total = int(sizes.sum())
    unmasked_tail[total:] = lhs[total:] @ rhs[np.flatnonzero(sizes)[-1]]
    assert C.rejects(uniform_rule, seed=1) and C.rejects(unmasked_tail, seed=1)
    assert not C.rejects(ref(1), seed=1)


def test_space_rejects_impossible_schedules():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {"tm": 512, "tk": 1024, "tn": 1536, "buffers": 2}
    assert space.check(biggest) is None  # ~14 MiB at bf16
    narrow = MegabloxGMM({"moe_mlp_dim": 1024}).schedule_space()
    assert "does not divide" in narrow.check({**space.default(), "tn": 768})
    with pytest.raises(ValueError):
        MegabloxGMM({"seq_len": 4100})  # M = 32800 is no multiple of 128
    with pytest.raises(ValueError):
        MegabloxGMM({"max_expert_size": 128})  # below M/num_experts = 256
    with pytest.raises(ValueError):
        MegabloxGMM({"num_experts": 96})  # 32768 rows do not split into 96 uniform groups


SCHEDULES = [{"tm": 512, "tk": 256, "tn": 1536, "buffers": 1}, {"tm": 128, "tn": 768}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_interpret():
    assert_expert_correct(W)


JAXBENCH_SIGNATURE = '''
import jax
import jax.numpy as jnp


def workload(lhs, rhs, group_sizes, max_expert_size):
    """JAXBench's signature: the fourth argument is the Python int bound on a group's size.
    The f32 result is returned as it is (megablox's preferred_element_type default)."""
    assert isinstance(max_expert_size, int) and max_expert_size > 0
    m, n = lhs.shape[0], rhs.shape[2]
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    rows = jnp.arange(max_expert_size)
    padded = jnp.pad(lhs, ((0, max_expert_size), (0, 0)))  # every window fits, wherever it starts

    def one_group(g, out):  # a window of max_expert_size rows from group g's start, the rest kept
        window = jax.lax.dynamic_slice_in_dim(padded, starts[g], max_expert_size)
        product = jnp.dot(window, rhs[g], preferred_element_type=jnp.float32)
        mine = starts[g] + rows < ends[g]
        kept = jax.lax.dynamic_slice_in_dim(out, starts[g], max_expert_size)
        return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(mine[:, None], product, kept), starts[g], 0)

    out = jnp.zeros((m + max_expert_size, n), jnp.float32)
    return jax.lax.fori_loop(0, rhs.shape[0], one_group, out)[:m]
'''


def test_jaxbench_signature_and_a_wider_float_output_are_accepted(evaluators):
    from jaxbench_env.candidate import Candidate

    result = evaluators("megablox_gmm").evaluate(Candidate(JAXBENCH_SIGNATURE, {}))
    assert result.compiled and result.correct and result.error is None, result.error
    narrower = JAXBENCH_SIGNATURE.replace("one_group, out)[:m]", "one_group, out)[:m].astype(jnp.float16)")
    assert narrower != JAXBENCH_SIGNATURE
    result = evaluators("megablox_gmm").evaluate(Candidate(narrower, {}))
    assert not result.correct and "output dtype float16 does not match" in result.error
