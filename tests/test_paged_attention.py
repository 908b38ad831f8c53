"""paged_attention (6p) at check size: inputs, reference vs float64 NumPy, degenerate and
plausible-wrong outputs rejected, the schedule space, the Pallas template and jax's expert
kernel in interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import AtCheckSize, assert_expert_correct, assert_template_correct, schedule_id
from workloads import WORKLOADS
from workloads.paged_attention import PagedAttention

W = PagedAttention()
CFG = W.check_config()
C = AtCheckSize(W)
inputs, ref = C.inputs, C.ref


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def numpy_paged_attention(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, kv_head_of=None):
    """The spec's math in float64: per sequence, gather its pages in table order, keep the
    first kv_len positions, softmax over them. ``kv_head_of`` maps a query head to its KV
    head (default: the spec's h // (query heads per KV head))."""
    queries, k_pages, v_pages = f64(queries), f64(k_pages), f64(v_pages)
    kv_lens, page_indices, cu_q_lens = (np.asarray(a) for a in (kv_lens, page_indices, cu_q_lens))
    n, hq, d = len(kv_lens), queries.shape[1], queries.shape[2]
    hkv = k_pages.shape[2]
    kv_head_of = kv_head_of or (lambda h: h // (hq // hkv))
    out = np.zeros((n, hq, d))
    for i in range(n):
        q = queries[cu_q_lens[i]]
        k = k_pages[page_indices[i]].reshape(-1, hkv, d)[: kv_lens[i]]
        v = v_pages[page_indices[i]].reshape(-1, hkv, d)[: kv_lens[i]]
        for h in range(hq):
            s = k[:, kv_head_of(h)] @ q[h] / np.sqrt(d)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:, kv_head_of(h)]
    return out


def test_registered_and_check_size_keeps_tiling():
    assert WORKLOADS["paged_attention"] is PagedAttention
    assert CFG == {"num_seqs": 4, "max_seq_len": 512, "num_query_heads": 16, "num_kv_heads": 2, "head_dim": 128,
                   "page_size": 16, "pages_per_seq": 32, "dtype": "bfloat16"}
    knobs = {k.name: k.values for k in W.schedule_space().knobs}
    assert CFG["pages_per_seq"] % max(knobs["pages_per_block"]) == 0
    # GQA ratio of the full config kept: 8 query heads per KV head
    assert CFG["num_query_heads"] // CFG["num_kv_heads"] == W.config["num_query_heads"] // W.config["num_kv_heads"]


def test_inputs_and_reference_shapes():
    q, k, v, lens, table, cu = jax.eval_shape(lambda: W.make_inputs(W.config, 0))
    assert q.shape == (64, 64, 128) and q.dtype == jnp.bfloat16
    assert k.shape == v.shape == (16384, 16, 8, 128) and k.dtype == jnp.bfloat16
    assert lens.shape == (64,) and table.shape == (64, 256) and cu.shape == (65,)
    assert lens.dtype == table.dtype == cu.dtype == jnp.int32
    out = jax.eval_shape(functools.partial(W.reference, W.config), q, k, v, lens, table, cu)
    assert out.shape == (64, 64, 128) and out.dtype == jnp.bfloat16


def test_seed0_is_spec_inputs_and_other_seeds_are_ragged_and_shuffled():
    keys = jax.random.split(jax.random.key(42), 5)
    q, k, v, lens, table, cu = inputs(0)
    n, total = CFG["num_seqs"], CFG["num_seqs"] * CFG["pages_per_seq"]
    np.testing.assert_array_equal(f64(q), f64(jax.random.normal(keys[0], q.shape, jnp.bfloat16)))
    np.testing.assert_array_equal(f64(k), f64(jax.random.normal(keys[1], k.shape, jnp.bfloat16)))  # unscaled: fix
    np.testing.assert_array_equal(f64(v), f64(jax.random.normal(keys[2], v.shape, jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(lens), np.full(n, CFG["max_seq_len"]))
    np.testing.assert_array_equal(np.asarray(table), np.arange(total).reshape(n, -1))
    np.testing.assert_array_equal(np.asarray(cu), np.arange(n + 1))
    for seed in (1, 2):
        _, _, _, lens, table, cu = inputs(seed)
        lens, table = np.asarray(lens), np.asarray(table)
        assert np.all((lens >= 1) & (lens <= CFG["max_seq_len"])) and np.any(lens < CFG["max_seq_len"])
        assert np.any(lens % CFG["page_size"])  # a sequence ends mid-page
        assert sorted(table.ravel()) == list(range(total)) and not np.array_equal(table.ravel(), np.arange(total))


@pytest.mark.parametrize("seed", (0, 1))
def test_reference_matches_float64_numpy(seed):
    exact = numpy_paged_attention(*inputs(seed))
    assert np.allclose(exact, ref(seed), atol=W.atol, rtol=W.rtol)
    assert ref(seed).std() > 3 * W.atol  # the fixed inputs give outputs well above atol


def test_an_exact_kernel_keeps_half_the_tolerance_whatever_the_seed():
    """The check compares with the float32 computation, widened by the bf16 reference's own
    error: at seed 75 that error alone uses 0.93 of the tolerance, so against the bf16
    reference a kernel more accurate than it (CI met one at 1.37) would fail at random."""
    e = C.expected(75)
    target = np.asarray(e.target, np.float32)
    exact = np.asarray(jnp.asarray(e.target).astype(jnp.bfloat16), np.float32)  # f32 math, rounded once
    used = lambda out, against, atol, rtol: np.max(np.abs(out - against) / (atol + rtol * np.abs(against)))
    assert used(exact, ref(75), W.atol, W.rtol) > 0.85  # the bf16 reference's own noise
    assert used(ref(75), target, e.atol, e.rtol) <= 0.5 + 1e-6  # the reference passes with margin
    assert used(exact, target, e.atol, e.rtol) < 0.25  # its one rounding to bf16
    assert C.rejects(np.zeros_like(target), 75) and C.rejects(target * 1.1, 75)


def test_degenerate_and_plausible_wrong_outputs_fail():
    r = ref(0)
    queries = np.asarray(inputs(0)[0], np.float32)  # same shape as the output
    for bad in (np.zeros_like(r), np.full_like(r, 1.0), np.full_like(r, r.mean()), queries):
        assert C.rejects(bad)
    hq, hkv = CFG["num_query_heads"], CFG["num_kv_heads"]
    assert C.rejects(numpy_paged_attention(*inputs(0), kv_head_of=lambda h: h % hkv))  # interleaved GQA mapping
    q, k, v, lens, table, cu = inputs(1)
    assert C.rejects(numpy_paged_attention(q, k, v, np.full_like(lens, CFG["max_seq_len"]), table, cu), seed=1)
    contiguous = np.arange(table.size, dtype=np.int32).reshape(table.shape)  # ignores the page table
    assert C.rejects(numpy_paged_attention(q, k, v, lens, contiguous, cu), seed=1)
    assert not C.rejects(r) and not C.rejects(ref(1), seed=1)
    assert hq // hkv > 1


def test_space_rejects_impossible_schedules_and_bad_configs():
    space = W.schedule_space()
    assert space.check(space.default()) is None
    biggest = {"pages_per_block": 32, "buffers": 2}
    assert space.check(biggest) is None  # compiles for v6e at the full size
    assert "VMEM" in PagedAttention({"head_dim": 2048}).schedule_space().check(biggest)
    odd = PagedAttention({"pages_per_seq": 40, "max_seq_len": 640}).schedule_space()
    assert "does not divide" in odd.check({**space.default(), "pages_per_block": 16})
    for bad in ({"max_seq_len": 4000}, {"num_query_heads": 60}, {"page_size": 8, "max_seq_len": 2048},
                {"head_dim": 64}, {"num_seqs": 0}):
        with pytest.raises(ValueError):
            PagedAttention(bad)


SCHEDULES = [{"pages_per_block": 16, "buffers": 2}, {"pages_per_block": 4, "buffers": 1}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=schedule_id)
def test_template_interpret(schedule):
    assert_template_correct(W, schedule)


def test_expert_interpret():
    assert_expert_correct(W)


JAXBENCH_SIGNATURE = '''
import jax
import jax.numpy as jnp


def workload(q, k_pages, v_pages, lengths, page_indices):
    """JAXBench's optimized signature (jax's kernel's convention): one query row per sequence,
    already scaled, no cu_q_lens, head-major pages (num_kv_heads, total_pages, page_size, head_dim)."""
    hkv, _, page_size, d = k_pages.shape
    group = q.shape[1] // hkv

    def one(q_i, length, table):
        k = k_pages[:, table].reshape(hkv, -1, d)  # (hkv, max_seq_len, d)
        v = v_pages[:, table].reshape(hkv, -1, d)
        s = jnp.einsum("hgd,htd->hgt", q_i.reshape(hkv, group, d).astype(jnp.float32), k.astype(jnp.float32))
        s = jnp.where(jnp.arange(k.shape[1]) < length, s, -jnp.inf)
        return jnp.einsum("hgt,htd->hgd", jax.nn.softmax(s, -1), v.astype(jnp.float32)).reshape(q_i.shape)

    return jax.vmap(one)(q, lengths, page_indices).astype(q.dtype)
'''


def test_jaxbench_signature_goes_through_the_adapter():
    """A 5-argument workload gets queries[cu_q_lens[:-1]] and head-major pages (traced into its
    program); a workload taking the six inputs is called as it is."""
    from jaxbench_env import candidate_process

    module = candidate_process.load_module(JAXBENCH_SIGNATURE, CFG, {})
    fn = candidate_process.entry_point(module, W, CFG, 6)
    assert fn is not module.workload
    jaxpr, _ = candidate_process.trace(fn, jax.eval_shape(lambda: W.make_inputs(CFG, 1)))
    assert sum(e.primitive.name == "transpose" for e in jaxpr.jaxpr.eqns) == 2  # the adapter's, priced
    for seed in (0, 1):  # seed 1: shuffled page table, ragged lengths
        assert not C.rejects(jax.jit(fn)(*inputs(seed)), seed=seed)
    queries, *_, cu_q_lens = inputs(1)
    q = W.jaxbench_signature(CFG)[1](*inputs(1))[0]  # jax's kernel takes no scale: its caller's
    np.testing.assert_array_equal(q, (queries[cu_q_lens[:-1]].astype(jnp.float32) * CFG["head_dim"] ** -0.5).astype(q.dtype))
    own = candidate_process.load_module(W.expert_source(), CFG, {})
    assert candidate_process.entry_point(own, W, CFG, 6) is own.workload


def test_single_buffered_pages_are_priced_in_line():
    """With one buffer a step waits for its page copies as soon as it starts them, so nothing
    hides them: priced above the double-buffered kernel at the full size (2.85 ms against
    2.18 ms when measured), where they had been priced as hidden behind compute."""
    from harness import judged_time_only

    times = {}
    for buffers in (1, 2):
        got = judged_time_only(W, W.template_source(), {"pages_per_block": 32, "buffers": buffers})
        [kernel] = got["details"]["sim"]["features"]["kernels"]
        times[buffers] = got["time_ms"]
        assert (kernel["row_waited_groups"] is not None) == (buffers == 1)
    assert times[1] > 1.2 * times[2]
