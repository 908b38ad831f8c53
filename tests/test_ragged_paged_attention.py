"""ragged_paged_attention (7p) at check size: the scenario, reference vs float64 NumPy (the
spec's scenario and a general one), degenerate and plausible-wrong outputs rejected, the
schedule space, the Pallas template in interpret mode, and jax's expert kernel, which the
TPU interpreter cannot run: compiled for v6e instead."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_template_correct, schedule_id
from jaxbench_env import candidate_process, judge
from workloads import WORKLOADS
from workloads.ragged_paged_attention import RaggedPagedAttention, scenario

W = RaggedPagedAttention()
CFG = W.check_config()
C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def numpy_rpa(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, causal=True, k_head=0):
    """The spec's math in float64, sequence by sequence. ``k_head`` is the combined head
    offset of K (0 in the spec; 1 swaps K and V)."""
    queries, kv_pages = f64(queries), f64(kv_pages)
    kv_lens, page_indices, cu = (np.asarray(a) for a in (kv_lens, page_indices, cu_q_lens))
    _, hq, d = queries.shape
    hkv = kv_pages.shape[2] // 2
    out = np.zeros_like(queries)
    for i in range(int(np.asarray(num_seqs)[0])):
        q_len, kv_len = cu[i + 1] - cu[i], kv_lens[i]
        pages = kv_pages[page_indices[i]].reshape(-1, 2 * hkv, d)[:kv_len]
        k, v = pages[:, k_head::2], pages[:, 1 - k_head::2]
        for r in range(q_len):
            pos = kv_len - q_len + r
            seen = pos + 1 if causal else kv_len
            for h in range(hq):
                s = k[:seen, h // (hq // hkv)] @ queries[cu[i] + r, h] / np.sqrt(d)
                p = np.exp(s - s.max())
                out[cu[i] + r, h] = (p / p.sum()) @ v[:seen, h // (hq // hkv)]
    return out


def general_inputs():
    """Seed 0's arrays with other lengths: 5 sequences, one without queries, q_len 100 > the
    scenario's chunks, a decode at the full page table, and a prefill with kv_len == q_len."""
    queries, kv_pages, _, page_indices, _, _ = inputs(0)
    slots = CFG["max_num_seqs"]
    q_lens, kv_lens = [3, 0, 100, 1, 40], [10, 7, 300, CFG["pages_per_seq"] * CFG["page_size"], 40]
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    cu = np.concatenate([cu, np.full(slots - len(q_lens), cu[-1])]).astype(np.int32)
    kv = np.array(kv_lens + [0] * (slots - len(kv_lens)), np.int32)
    return queries, kv_pages, jnp.asarray(kv), page_indices, jnp.asarray(cu), jnp.asarray([len(q_lens)], jnp.int32)


def test_registered_and_check_size_keeps_tiling():
    assert WORKLOADS["ragged_paged_attention"] is RaggedPagedAttention
    assert CFG == {"max_num_batched_tokens": 256, "max_num_seqs": 16, "num_q_heads": 16, "num_kv_heads": 2,
                   "head_dim": 128, "page_size": 16, "pages_per_seq": 32, "dtype": "bfloat16"}
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["max_num_batched_tokens"] % max(knobs["q_block"]) == 0
    assert CFG["pages_per_seq"] % max(knobs["pages_per_block"]) == 0


def test_scenario_is_the_spec_at_full_size_and_mixed_at_check_size():
    q_lens, kv_lens = scenario(W.config)
    assert q_lens == [1] * 48 + [512] * 7 + [464] and sum(q_lens) == 4096
    assert kv_lens == [257 + ((73 * i) % 240) * 16 for i in range(48)] + [1023, 1535, 2047, 2559, 3071, 3583,
                                                                         4095, 4095]
    q_lens, kv_lens = scenario(CFG)
    assert sum(q_lens) == CFG["max_num_batched_tokens"] and len(q_lens) < CFG["max_num_seqs"]
    assert q_lens.count(1) == 12 and sorted(q_lens[12:]) == [116, 128]  # decodes and prefill chunks
    assert all(q <= kv <= CFG["pages_per_seq"] * CFG["page_size"] for q, kv in zip(q_lens, kv_lens))
    assert all(kv % CFG["page_size"] for kv in kv_lens)  # every sequence ends mid-page


def test_inputs_and_reference_shapes_and_seed0_is_spec():
    q, kv, lens, table, cu, n = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == (4096, 64, 128) and kv.shape == (16384, 16, 16, 128) and q.dtype == kv.dtype == jnp.bfloat16
    assert lens.shape == (64,) and table.shape == (64, 256) and cu.shape == (65,) and n.shape == (1,)
    out = jax.eval_shape(functools.partial(W.reference, W.config), q, kv, lens, table, cu, n)
    assert out.shape == (4096, 64, 128) and out.dtype == jnp.bfloat16

    k1, k2, k3 = jax.random.split(jax.random.key(42), 3)
    q, kv, lens, table, cu, n = inputs(0)
    np.testing.assert_array_equal(f64(q), f64(jax.random.normal(k1, q.shape, jnp.bfloat16)))
    np.testing.assert_array_equal(f64(kv), f64(jax.random.normal(k2, kv.shape, jnp.bfloat16)))
    perm = jax.random.permutation(k3, table.size, independent=True).reshape(table.shape)
    np.testing.assert_array_equal(np.asarray(table), np.asarray(perm))
    q_lens, kv_lens = scenario(CFG)
    assert int(n[0]) == len(q_lens) and list(np.asarray(lens)[: len(q_lens)]) == kv_lens
    assert not np.asarray(lens)[len(q_lens):].any() and np.all(np.asarray(cu)[len(q_lens):] == sum(q_lens))
    # other seeds: a random batch (``random_scenario``), fresh values and a fresh permutation
    q1, _, lens1, table1, cu1, _ = inputs(1)
    assert not np.array_equal(np.asarray(cu1), np.asarray(cu)) and not np.array_equal(np.asarray(lens1), np.asarray(lens))
    assert not np.array_equal(np.asarray(table1), np.asarray(table)) and not np.array_equal(f64(q1), f64(q))


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    assert np.allclose(numpy_rpa(*inputs(seed)), ref(seed), atol=W.atol, rtol=W.rtol)


def test_reference_is_general():
    case = general_inputs()
    out = np.asarray(jax.jit(functools.partial(W.reference, CFG))(*case), np.float32)
    assert np.allclose(numpy_rpa(*case), out, atol=W.atol, rtol=W.rtol)
    assert not out[144:].any()  # rows past the last sequence stay zero


def test_degenerate_and_plausible_wrong_outputs_fail():
    r = ref(0)
    queries = np.asarray(inputs(0)[0], np.float32)  # same shape as the output
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), queries):
        assert C.rejects(bad)
    q, kv, lens, table, cu, n = inputs(0)
    assert C.rejects(numpy_rpa(q, kv, lens, table, cu, n, causal=False))
    assert C.rejects(numpy_rpa(q, kv, lens, table, cu, n, k_head=1))  # K and V swapped
    contiguous = np.arange(table.size, dtype=np.int32).reshape(table.shape)  # ignores the page table
    assert C.rejects(numpy_rpa(q, kv, lens, contiguous, cu, n))
    assert not C.rejects(r)


def test_space_rejects_impossible_schedules_and_bad_configs():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    base = space.default()
    assert space.check({**base, "q_block": 128, "pages_per_block": 16, "buffers": 2}) is None  # compiles for v6e
    assert space.check({**base, "q_block": 64, "pages_per_block": 32, "buffers": 2}) is None  # compiles for v6e
    too_big = {**base, "q_block": 128, "pages_per_block": 32, "buffers": 1}
    assert "VMEM" in space.check(too_big)  # CompileTimeScopedVmemOom on v6e
    odd = RaggedPagedAttention({"max_num_batched_tokens": 4080, "pages_per_seq": 200}).schedule_space()
    assert "does not divide" in odd.check({**space.default(), "q_block": 32})
    assert "does not divide" in odd.check({**space.default(), "q_block": 16, "pages_per_block": 16})
    f32 = RaggedPagedAttention({"dtype": "float32"}).schedule_space()
    assert "16-bit" in f32.check({**f32.default(), "kv_load": "words"})  # no row pairs in a 32-bit word
    for bad in ({"max_num_seqs": 60}, {"num_q_heads": 60},
                {"pages_per_seq": 16}):  # the last: prefill chunks of 512 need kv_len > 256
        with pytest.raises(ValueError):
            RaggedPagedAttention(bad)
    # Configs the reference runs and the template cannot: every schedule says why.
    for config, why in (({"page_size": 8}, "page_size a multiple of 16"), ({"head_dim": 64}, "head_dim"),
                        ({"num_q_heads": 32}, "multiple of 8")):
        limited = RaggedPagedAttention(config).schedule_space()
        assert all(why in limited.check(s) for s in limited.all_schedules())


SCHEDULES = [{"q_block": 128, "pages_per_block": 8, "buffers": 1, "q_splits": 4},
             {"q_block": 16, "pages_per_block": 16, "buffers": 2},
             # K and V split by shifts from one load of the pages' 32-bit words
             {"q_block": 64, "pages_per_block": 16, "buffers": 2, "kv_load": "words"},
             # each decode's row scored in a pass of 8 tokens (the best predicted schedule)
             {"q_block": 64, "pages_per_block": 32, "buffers": 2, "kv_load": "words", "q_splits": 8}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_template_serves_heads_wider_than_a_lane_tile():
    # The running max and sum are kept one lane tile wide and repeated across head_dim's tiles.
    assert_template_correct(RaggedPagedAttention({"head_dim": 256}), {"q_block": 32, "pages_per_block": 8,
                                                                      "q_splits": 2})


def test_template_is_general():
    from jax.experimental.pallas import tpu as pltpu

    case = general_inputs()
    module = candidate_process.load_module(W.template_source(), CFG, {"q_block": 32, "pages_per_block": 8,
                                                                       "q_splits": 4})
    with pltpu.force_tpu_interpret_mode():
        out = np.asarray(jax.jit(module.workload)(*case), np.float32)
    expect = np.asarray(jax.jit(functools.partial(W.reference, CFG))(*case), np.float32)
    judge.compare_outputs(out, expect, W.atol, W.rtol)


def test_interpreter_still_cannot_run_the_expert():
    """jax's TPU interpreter fails on RPA's ref reshapes; when this test fails, jax has fixed
    it: set expert_checks_on_cpu = True and check the expert like the others."""
    from jax.experimental.pallas import tpu as pltpu

    assert W.expert_checks_on_cpu is False
    module = candidate_process.load_module(W.expert_source(), CFG, {})
    with pytest.raises(Exception, match="ReshapeTransform"), pltpu.force_tpu_interpret_mode():
        jax.block_until_ready(jax.jit(module.workload)(*inputs(0)))


@pytest.mark.slow
def test_expert_is_priced_unchecked_and_only_byte_for_byte(evaluators):
    # jax's kernel picks constants by comparing sizes, so no check size traces to its
    # full-size program; nothing of it runs at the check size, so our own expert file is
    # compiled and priced (correct None). The same kernel in any other file is judged like
    # every candidate, and that size-chosen constant rejects it.
    from jaxbench_env.candidate import Candidate

    ev = evaluators("ragged_paged_attention")
    expert = ev.expert()
    assert expert.compiled and expert.correct is None and expert.time_ms > 0, expert.error
    assert "check-size program differs" in " ".join(expert.details.get("check_caveats", []))
    edited = ev.evaluate(Candidate(W.expert_source() + "\n# edited\n", {}))
    assert edited.correct is False and "one program" in edited.error


LLAMA_8B_GROUPS = {"num_q_heads": 32, "num_kv_heads": 8, "max_num_batched_tokens": 512, "max_num_seqs": 16,
                   "pages_per_seq": 64}


def test_a_config_the_template_cannot_serve_is_still_an_environment(make_env, cli):
    """Llama-3.1-8B's 4 query heads per KV head: the reference runs it, the template needs 8."""
    env = make_env("ragged_paged_attention", LLAMA_8B_GROUPS)
    obs, info = env.reset(seed=0)
    assert info["baseline_ms"] > 0 and info["speedup"] is None
    assert "template cannot serve this config" in info["error"] and "multiple of 8" in info["error"]
    assert not obs["action_mask"].any()  # no schedule of the template is legal here
    p = cli("show", "ragged_paged_attention", "--config", "num_q_heads=32,num_kv_heads=8")
    assert p.returncode == 0 and "cannot serve this config" in p.stdout, p.stderr
