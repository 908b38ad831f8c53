"""The Pallas validation's data and pieces (``jaxbench_env.validation``): the matmul guide's
rows, the RPA shape sampler, batch and legal pairs, one compile and prediction of jax's
ragged paged attention kernel with concrete scalar-prefetch tables, and the sparse guide's
rows, tables and kernels (run by the interpreter, and priced for v5e)."""

from jaxbench_env.aot import prepare_process

prepare_process()

import json  # noqa: E402

import numpy as np  # noqa: E402

import pytest  # noqa: E402

from jaxbench_env import validation as v  # noqa: E402


def test_matmul_guide_csv_has_the_guides_rows():
    rows = v.load_matmul_guide()
    assert len(rows) == 21
    pallas = [r for r in rows if r["variant"] != "xla"]
    assert {r["variant"] for r in pallas} == {"plain", "transpose_rhs", "relu"}
    assert {(r["bm"], r["bk"], r["bn"]) for r in pallas} == {(128, 128, 128), (512, 1024, 1024)}
    assert {r["m"] for r in rows} == {1024, 4096, 8192}
    assert len({(r["variant"], r["m"], r["bm"]) for r in rows}) == 21
    for r in rows:
        assert r["dtype"] == "bfloat16" and r["m"] == r["k"] == r["n"]
        # the guide's own arithmetic: FLOP/s = 2mkn / time, utilization against 197 TFLOP/s
        assert r["measured_flops_per_s"] == pytest.approx(2 * r["m"] ** 3 / r["measured_s"], rel=1e-9)
        assert r["utilization_pct"] == pytest.approx(100 * r["measured_flops_per_s"] / 197e12, abs=1e-3)
    plain = {(r["m"], r["bm"]): r["measured_s"] for r in pallas if r["variant"] == "plain"}
    assert plain[(8192, 512)] == pytest.approx(6.099433819763363e-3)
    assert plain[(4096, 128)] == pytest.approx(11.771515250438824e-3)
    header = v.GUIDE_CSV.read_text().splitlines()[:3]
    assert any("github.com/jax-ml/jax/blob/" in line and "matmul.ipynb" in line for line in header)


def test_rpa_sampler_is_deterministic_and_spread():
    shapes = v.sample_rpa_shapes(20, seed=0)
    assert len(shapes) == 20 and len(set(shapes)) == 20
    assert shapes == v.sample_rpa_shapes(20, seed=0)
    assert shapes != v.sample_rpa_shapes(20, seed=1)
    table = v.rpa_tuned_table("TPU v6")
    for s in shapes:  # straight from the table
        key = ("bfloat16", "bfloat16", s.num_q_heads, s.num_kv_heads, s.head_dim, s.page_size,
               s.max_num_batched_tokens, s.max_model_len)
        assert table[key] == s.tuned
    assert len({(s.num_q_heads, s.num_kv_heads) for s in shapes}) >= 7  # every head pair of the table
    assert len({s.page_size for s in shapes}) == 5
    assert len({s.max_num_batched_tokens for s in shapes}) == 4
    assert len({s.max_model_len for s in shapes}) >= 6


def test_rpa_batch_is_the_tuning_example():
    # 34 one-token decodes and one sequence with the rest of min(T, L) tokens, all at KV length L
    for s in v.rpa_shapes():
        b = v.rpa_batch(s)
        assert sum(b.q_lens) == min(s.max_num_batched_tokens, s.max_model_len)
        assert all(1 <= q <= kv == s.max_model_len for q, kv in zip(b.q_lens, b.kv_lens))
    s = v.RpaShape(8, 2, 128, 64, 4096, 1024, (16, 64))
    b = v.rpa_batch(s)
    assert b.q_lens == (1,) * 34 + (990,) and b.max_num_seqs == 128
    tables = v.rpa_tables(s)
    assert tables["cu_q_lens"][-1] == 1024 and int(tables["num_seqs"][0]) == 35
    assert list(tables["kv_lens"][:36]) == [1024] * 35 + [0]
    assert sorted(tables["page_indices"].ravel()) == list(range(128 * 16))


def test_rpa_legal_pairs():
    # 1280-token model length in 128-token pages: 10 pages per sequence, so 16-page blocks are out.
    s = v.RpaShape(8, 1, 128, 128, 2048, 1280, (4, 64))
    assert s.pages_per_seq == 10
    assert v.rpa_pairs(s) == [(kv, q) for kv in (4, 8) for q in (32, 64, 128, 256)]
    # the tuned pair and its nearest neighbours
    assert v.rpa_pairs(s, max_pairs=3) == [(4, 32), (4, 64), (4, 128)]
    assert v.rpa_pairs(s, max_pairs=1) == [(4, 64)]
    # 4 pages per sequence: only 4-page blocks
    small = v.RpaShape(4, 2, 128, 16, 512, 64, (4, 64))
    assert v.rpa_pairs(small) == [(4, 32), (4, 64), (4, 128), (4, 256)]
    assert v.rpa_vmem_bytes(s, 8, 256) > v.rpa_vmem_bytes(s, 4, 32) > 0


def test_one_rpa_compile_prices_with_concrete_tables():
    s = v.RpaShape(4, 2, 128, 16, 512, 64, (4, 64))  # the smallest shape of the table
    got = v.predict_rpa(s, 4, 64)
    assert got["time_s"] > 0 and got["model_s"] > 0
    assert not got["unevaluated_index_maps"]
    assert not any(v.NOTE_UNEVALUATED in n for n in got["notes"])
    [kernel] = got["kernels"]
    assert kernel["name"] == "ragged_paged_attention_kernel" and kernel["steps"] == 512 // 64
    assert kernel["compute_from"] == "bundles"
    # A saved sweep re-prices without compiling: its features survive JSON and price the same.
    from jaxbench_env.sim.model import ProgramFeatures, price

    saved = json.loads(json.dumps(got["features"]))
    assert price(ProgramFeatures.from_dict(saved)).time_s == pytest.approx(got["model_s"], rel=1e-12)


def test_sim_report_has_the_pallas_validation_flag():
    from jaxbench_env.cli import build_parser

    args = build_parser().parse_args(["sim-report", "--pallas-validation", "--rpa-shapes", "2"])
    assert args.pallas_validation and args.rpa_shapes == 2
    args = build_parser().parse_args(["sim-report"])
    assert not args.pallas_validation and args.rpa_shapes == 6


def test_a_saved_sweep_reprices_without_compiling(monkeypatch):
    s = v.RpaShape(4, 2, 128, 16, 512, 64, (4, 64))
    swept = v.run_rpa(shapes=[s], max_pairs=1, progress=False, pair_cache=(pairs := {}))
    saved = json.loads(json.dumps({**swept, "seed": 0, "pairs": pairs}))
    monkeypatch.setattr(v, "predict_rpa", lambda *a, **k: pytest.fail("re-pricing compiled"))
    again = v.reprice_rpa(saved)
    assert again["shapes"][0]["times_s"] == pytest.approx(swept["shapes"][0]["times_s"], rel=1e-12)
    assert (again["scored"], again["within_10pct"]) == (swept["scored"], swept["within_10pct"])
    with pytest.raises(ValueError, match="version"):
        v.reprice_rpa({**saved, "simulator": {**saved["simulator"], "features_version": -1}})


# --- the sparse guide ----------------------------------------------------------------------------

def test_sparse_guide_csv_has_the_guides_rows():
    rows = {r["kernel"]: r for r in v.load_sparse_guide()}
    assert set(rows) == {"sparse_dense", "xla_matmul", "output_mask", "xla_output_mask"}
    assert all(r["m"] == r["k"] == r["n"] == 16384 and r["dtype"] == "bfloat16" for r in rows.values())
    assert rows["sparse_dense"]["measured_s"] == pytest.approx(8.136e-3)
    assert rows["output_mask"]["measured_s"] == pytest.approx(28.648e-3)
    assert (rows["output_mask"]["bm"], rows["output_mask"]["bk"], rows["output_mask"]["bn"]) == (512, 1024, 512)
    # the guide's own draw, reproduced: 86 nonzero blocks of 32 x 32
    assert rows["sparse_dense"]["computed_blocks"] == int(v.guide_lhs_blocks((32, 32)).sum()) == 86
    # a lower-triangular mask computes the blocks on and below the diagonal: 32 * 33 / 2
    assert rows["output_mask"]["computed_blocks"] == int(v.lower_triangle_blocks(16384, 16384, 512, 512)[0].sum())
    header = v.SPARSE_GUIDE_CSV.read_text().splitlines()[:4]
    assert any("github.com/jax-ml/jax/blob/" in line and "sparse.ipynb" in line for line in header)


def test_next_computed_points_skipped_blocks_at_the_next_computed_one():
    live = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    kinds = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 0]], np.int32)
    kind, row, col = v.next_computed(live, kinds)
    assert (row.tolist(), col.tolist()) == ([[0, 1, 1], [1, 1, 2], [2, 2, 2]], [[0, 1, 1], [1, 1, 2], [2, 2, 2]])
    assert kind.tolist() == [[1, 2, 2], [2, 2, 0], [0, 0, 0]]


def _sparse_row(kernel, n, blocks, dtype="float32"):
    """A sparse-guide row at size n^3 (its measured time a placeholder)."""
    return {"kernel": kernel, "m": n, "k": n, "n": n, "dtype": dtype, "bm": blocks[0], "bk": blocks[1],
            "bn": blocks[2], "measured_s": 1.0}


def _sparse_case(kernel, n, blocks, live=None):
    return v.sparse_guide_case(_sparse_row(kernel, n, blocks), live)


def _interpreted(fn, *args):
    """``fn`` on ``args`` with its Pallas kernels run by jax's interpreter (the check's way)."""
    import jax
    from jax.extend.core import jaxpr_as_fun

    from jaxbench_env.candidate_process import wrap_kernels

    return [np.asarray(o) for o in jaxpr_as_fun(wrap_kernels(jax.jit(fn).trace(*args).jaxpr, True))(*args)]


def test_the_sparse_guides_kernels_compute_their_products_in_interpret_mode():
    rng = np.random.default_rng(0)
    n, b = 64, 16
    live = np.zeros((4, 4), bool)
    live[[0, 0, 2, 3], [1, 3, 0, 3]] = True  # block row 1 has no tile: its output stays zero
    fn, _, _, _ = _sparse_case("sparse_dense", n, (b, b, b), live)
    rows, cols = (a.astype(np.int32) for a in np.nonzero(live))
    tiles = rng.standard_normal((len(rows), b, b)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    dense = np.zeros((n, n), np.float32)
    for t, (r, c) in enumerate(zip(rows, cols)):
        dense[r * b:(r + 1) * b, c * b:(c + 1) * b] = tiles[t]
    [got] = _interpreted(fn, rows, cols, tiles, y, np.zeros((n, n), np.float32))
    np.testing.assert_allclose(got, dense @ y, rtol=1e-4, atol=1e-3)
    assert not got[b:2 * b].any()

    fn, _, _, _ = _sparse_case("output_mask", n, (b, 2 * b, b))
    computed, kinds, tile_masks = v.lower_triangle_blocks(n, n, b, b)
    x = rng.standard_normal((n, n)).astype(np.float32)
    [got] = _interpreted(fn, computed.astype(np.int32), *v.next_computed(computed, kinds), x, y, tile_masks)
    np.testing.assert_allclose(got, np.tril(x @ y), rtol=1e-4, atol=1e-3)


def test_one_sparse_guide_compile_prices_only_the_steps_that_compute():
    """At 2048^3 with 256 blocks: the masked kernel's skipped steps move and compute nothing
    new, so it is priced well under the dense one's kernel and over half of it."""
    if v.v5e_available() is not None:
        pytest.skip("no v5e compile target: " + v.v5e_available())
    n, b = 2048, 256
    priced = {}
    for kernel, blocks in (("output_mask", (b, 2 * b, b)), ("sparse_dense", (b, b, b))):
        row = _sparse_row(kernel, n, blocks, "bfloat16")
        live = np.ones((n // b, n // b), bool) if kernel == "sparse_dense" else None
        priced[kernel] = got = v.price_timed_row(row, lambda: v.sparse_guide_case(row, live), "v5e", False, kernel)
        assert got["error"] is None and not any(v.NOTE_UNEVALUATED in note for note in got["notes"])
    # every block live: sparse_dense is a dense blocked matmul of 8 x 64 steps
    assert priced["sparse_dense"]["steps"] == (n // b) * (n // b) ** 2
    assert priced["output_mask"]["steps"] == (n // b) ** 2 * (n // (2 * b))
    assert 0.5 < priced["output_mask"]["predicted_s"] / priced["sparse_dense"]["predicted_s"] < 0.8
