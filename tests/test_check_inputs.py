"""The check's inputs: seed 0 is the spec's draw, unchanged; the seeds the judge checks with
(never 0) are structured (``workloads.base.structured_normal``), so that a kernel cannot pass
by exploiting i.i.d. inputs' statistics.

(a) For every workload: seed 0's inputs at the check size hash to what the code gave before
the structured inputs (hashes taken from that code, commit 6a65fcc); seeds 1 and 2 differ
from an i.i.d. draw as intended: an entry beyond 5 sds, row or column means far outside what
i.i.d. rows give, rows of different spreads; every input the spec draws constant (ones,
zeros, an all-ones mask) varies; integer inputs are ragged, and not the model's outputs.

(b) Shortcut kernels that pass the check on seed 0 (the spec's i.i.d. draw, which is what
every seed drew before) are rejected by the check (``AtCheckSize.rejects``) on the
structured seeds: a cross-entropy computed from the inputs' moments, a second-order
polynomial gelu, a kernel that drops a bias, an eval-mode batchnorm that assumes zero running
means and unit variances, an RMS norm that uses the variance (assumes zero-mean rows), and a
triangle update that ignores the mask.
"""

from __future__ import annotations

import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from harness import AtCheckSize

import workloads
from workloads.ragged_paged_attention import scenario

# sha256[:16] of each workload's seed-0 inputs at its check size (shape, dtype and bytes of
# every leaf in order), computed with the code before the structured inputs (commit 6a65fcc);
# the two whose check size has grown since, with that commit's code at the new size.
SEED0_HASHES = {
    "bmm_instancenorm_sum_residualadd_multiply": "c48b2a7d685a6ec2",
    "conv2d_activation_batchnorm": "e581f25ab3e304f8",
    "conv2d_gelu_globalavgpool": "4470bf54b96d62f9",  # check size 32x128 since 2026-12-06
    "conv2d_groupnorm_tanh_hardswish_residualadd_logsumexp": "16022789878d404d",
    "conv2d_instancenorm_divide": "9af40b2e8ae8b5ce",
    "conv2d_relu_biasadd": "b4761f1a97a8b31a",
    "conv3d_groupnorm_mean": "6752d80bbca0d9a4",
    "conv3d_mish_tanh": "3312951bdf6eb352",
    "convtranspose3d_layernorm_gelu_scaling": "f5a33bd5a3a5a029",  # depth 8 (since 2026-12-05)
    "cross_entropy": "7e8a00f4ab74547f",
    "flash_attention": "d2cf1021de1ce5a0",
    "flex_attention": "96ec1ae79fc648fb",
    "gemm": "78aaaa83eccfea12",
    "gemm_add_relu": "18949315bc48a665",
    "gemm_batchnorm_gelu_relu": "d3e20c5c12252625",
    "gemm_batchnorm_scaling_softmax": "f05f3629d81651cb",
    "gemm_divide_sum_scaling": "691e86a3f44b0788",
    "gemm_groupnorm_min_biasadd": "799f095ddf9f77f5",
    "gemm_groupnorm_swish_multiply_swish": "1e65a97ff48dbec0",
    "gemm_max_subtract_gelu": "fe82c9d960a99614",
    "gemm_multiply_leakyrelu": "18949315bc48a665",
    "gemm_scaling_hardtanh_gelu": "18949315bc48a665",
    "gemm_sigmoid_logsumexp": "9ae274bc62ee53fd",
    "gqa_attention": "7773520ec07ef2a9",
    "mamba2_ssd": "b3f501afa6fed833",
    "matmul_add_swish_tanh_gelu_hardtanh": "61e2e07a8e924d40",
    "matmul_avgpool_gelu_scale_max": "18949315bc48a665",
    "matmul_batchnorm_biasadd_divide_swish": "b17184540f4fe629",
    "matmul_divide_gelu": "18949315bc48a665",
    "matmul_dropout_softmax": "155e62e0430619e1",
    "matmul_gelu_softmax": "d5115aa9d7c0847d",
    "matmul_mish_mish": "18949315bc48a665",
    "matmul_scale_residualadd_clamp_logsumexp_mish": "155e62e0430619e1",
    "matmul_scaling_residualadd": "0e551e320cec69ab",
    "matmul_sigmoid_sum": "d5115aa9d7c0847d",
    "matmul_subtract_multiply_relu": "18949315bc48a665",
    "matmul_sum_max_avgpool_logsumexp_logsumexp": "96d336f1f657f403",
    "matmul_swish_scaling": "18949315bc48a665",
    "matmul_swish_sum_groupnorm": "a42125db6e32ce94",
    "megablox_gmm": "a2c2f0a2c049abcc",  # emb_dim 2048 (since 2026-12-06)
    "mixtral_moe": "aeb2d026ba2adf1c",
    "mla_attention": "7bda3b06c3ef9369",  # batch 2 (since 2026-12-05)
    "paged_attention": "416f2d184bff4dce",
    "ragged_dot": "cf00b72b19719b27",
    "ragged_paged_attention": "affdaaa4631e9c07",
    "retnet_retention": "da9394448f1da6aa",
    "rmsnorm": "12e8bb33ec538cd5",
    "sparse_attention": "0685d3f72eaf3e99",
    "swiglu_mlp": "3f50413c2115f714",
    "triangle_multiplication": "af0a9ad1e5079577",
}
NAMES = sorted(workloads.WORKLOADS)
STRUCTURED_SEEDS = (1, 2)


def digest(inputs) -> str:
    h = hashlib.sha256()
    for a in jax.tree_util.tree_leaves(inputs):
        a = np.asarray(a)
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def statistics(x: np.ndarray) -> dict[str, float]:
    """How far one float32 array is from i.i.d., each about 1 or less for an i.i.d. draw (a
    uniform's largest deviation is 1.7 sds, a bf16 normal's ~3). The array is viewed as rows
    and columns at every split of its axes (a matrix's rows, an image's pixels by channel), and
    the largest value kept:

    outlier: the largest |x - mean|, in sds, over 5 (the test's threshold);
    means: the spread of the row means, or of the column means, over what i.i.d. rows or
    columns give (sd / sqrt(their length));
    scales: the spread of the rows' sds over what i.i.d. rows give (sd / sqrt(2 * columns)).
    """
    while x.size > 2**21 and x.ndim > 1:  # a leading block of a large array is enough (and faster)
        x = x[: x.shape[0] // 2] if x.shape[0] > 1 else x[0]
    sd = float(x.std())
    out = {"outlier": float(np.abs(x - x.mean()).max()) / sd / 5, "means": 0.0, "scales": 0.0}
    for split in range(1, x.ndim):
        m = x.reshape(math.prod(x.shape[:split]), -1)
        rows, cols = m.shape
        if rows > 1 and cols > 1:
            out["means"] = max(out["means"], float(m.mean(1).std()) / (sd / math.sqrt(cols)),
                               float(m.mean(0).std()) / (sd / math.sqrt(rows)))
            out["scales"] = max(out["scales"], float(m.std(1).std()) / (sd / math.sqrt(2 * cols)))
    return out


def float_arrays(inputs) -> list[np.ndarray]:
    """The float inputs as float32 NumPy arrays (None for integer inputs, to keep positions)."""
    return [np.asarray(a.astype(jnp.float32)) if jnp.issubdtype(a.dtype, jnp.floating) else None for a in inputs]


def test_statistics_of_iid_draws_are_below_the_thresholds():
    """What the thresholds below separate: the spec's i.i.d. draws (bf16 normal and uniform
    matrices, an image batch) stay under them."""
    for draw in (jax.random.normal(jax.random.key(1), (512, 1024), jnp.bfloat16),
                 jax.random.uniform(jax.random.key(2), (512, 1024), jnp.bfloat16),
                 jax.random.uniform(jax.random.key(3), (4, 64, 20, 20), jnp.bfloat16)):
        stats = statistics(np.asarray(draw.astype(jnp.float32)))
        assert stats["outlier"] < 1 and stats["means"] < 1.5 and stats["scales"] < 1.5, stats


@pytest.mark.parametrize("name", NAMES)
def test_seed0_is_unchanged_and_the_check_seeds_are_structured(name):
    assert set(SEED0_HASHES) == set(NAMES)
    w = workloads.get(name)
    cfg = w.check_config()
    spec = w.make_inputs(cfg, 0)
    assert digest(spec) == SEED0_HASHES[name], "seed 0 must stay the spec's inputs"
    constant = [x is not None and x.size > 1 and np.ptp(x) == 0 for x in float_arrays(spec)]
    drawn = {}
    for seed in STRUCTURED_SEEDS:
        inputs = w.make_inputs(cfg, seed)
        assert [(a.shape, a.dtype) for a in inputs] == [(a.shape, a.dtype) for a in spec]
        arrays = float_arrays(inputs)
        drawn[seed] = [x for x in arrays if x is not None]
        assert all(np.all(np.isfinite(x)) for x in drawn[seed])
        stats = [statistics(x) for x in drawn[seed] if np.ptp(x) > 0]
        # Some entry beyond 5 sds; row or column means twice as spread as i.i.d. rows' (whose
        # statistic is 1 +- a few %); rows' spreads twice as different as i.i.d. rows'.
        assert max(s["outlier"] for s in stats) > 1, f"{name} seed {seed}: no outliers"
        assert max(s["means"] for s in stats) > 2, f"{name} seed {seed}: no row or column means"
        assert max(s["scales"] for s in stats) > 2, f"{name} seed {seed}: no row scales"
        for was_constant, x in zip(constant, arrays):  # the spec's ones, zeros, all-ones mask vary
            assert not was_constant or np.ptp(x) > 0, f"{name} seed {seed}: a constant input stayed constant"
    assert any(not np.array_equal(a, b) for a, b in zip(drawn[1], drawn[2]) if a.size > 1)


def test_integer_inputs_are_ragged_and_not_the_models_outputs():
    # cross_entropy: labels uniform over the vocabulary (not sampled from the logits), hidden
    # states pointing at them (the label's logit well above the token's mean logit).
    ce = workloads.get("cross_entropy")
    cfg = ce.check_config()
    for seed in STRUCTURED_SEEDS:
        hidden, weight, labels = ce.make_inputs(cfg, seed)
        labels = np.asarray(labels)
        assert labels.min() >= 0 and labels.max() < cfg["vocab_size"]
        assert len(np.unique(labels)) > 0.8 * cfg["batch_tokens"]  # ~0.89 for uniform draws
        logits = f64(hidden) @ f64(weight)
        raised = logits[np.arange(len(labels)), labels] - logits.mean(axis=1)
        assert raised.mean() > 2 and raised.min() < 1  # some labels are not favoured at all
    # paged_attention: ragged lengths (one full table, one within a page), a shuffled table.
    pa = workloads.get("paged_attention")
    cfg = pa.check_config()
    for seed in STRUCTURED_SEEDS:
        *_, lens, table, _ = pa.make_inputs(cfg, seed)
        lens, table = np.asarray(lens), np.asarray(table)
        assert lens.max() == cfg["max_seq_len"] and 1 <= lens.min() <= cfg["page_size"]
        assert np.array_equal(np.sort(table.ravel()), np.arange(table.size))
        assert not np.array_equal(table.ravel(), np.arange(table.size))
    # ragged_paged_attention: a random batch, not the spec's scenario.
    rpa = workloads.get("ragged_paged_attention")
    cfg = rpa.check_config()
    layouts = []
    for seed in STRUCTURED_SEEDS:
        _, _, lens, _, cu, n = rpa.make_inputs(cfg, seed)
        q_lens = np.diff(np.asarray(cu))[: int(n[0])]
        kv = np.asarray(lens)[: int(n[0])]
        assert q_lens.sum() <= cfg["max_num_batched_tokens"] and np.all(kv >= np.maximum(q_lens, 1))
        assert (list(q_lens), list(kv)) != scenario(cfg)
        layouts.append((list(q_lens), list(kv)))
    assert layouts[0] != layouts[1]
    # megablox_gmm: ragged group sizes with empty groups.
    gmm = workloads.get("megablox_gmm")
    for seed in STRUCTURED_SEEDS:
        sizes = np.asarray(gmm.make_inputs(gmm.check_config(), seed)[2])
        assert (sizes == 0).any() and len(set(sizes.tolist())) > 1


# --- (b) shortcuts that pass on the spec's i.i.d. draw (seed 0) and fail the check ----------


def judged(workload_name: str, shortcut) -> dict[int, bool]:
    """{seed: rejected} for ``shortcut(inputs) -> output`` at seed 0 and the structured seeds."""
    c = AtCheckSize(workloads.get(workload_name))
    return {seed: c.rejects(shortcut(c.inputs(seed)), seed) for seed in (0, *STRUCTURED_SEEDS)}


def test_moments_cross_entropy_fails():
    """The loss from the inputs' moments, no projection: logits ~ N(0, sigma_t^2) with sigma_t^2 =
    sum_k hidden_tk^2 mean_v weight_kv^2, labels sampled from the softmax (E[label logit] =
    sigma_t^2): loss = ln V - mean sigma_t^2 / 2. Within 0.002 of the spec's loss on seed 0."""

    def moments(inputs):
        hidden, weight, _ = (f64(a) for a in inputs)
        sigma2 = (hidden**2) @ (weight**2).mean(axis=1)
        return np.float32(np.mean(np.log(weight.shape[1]) - sigma2 / 2))

    assert judged("cross_entropy", moments) == {0: False, 1: True, 2: True}


def test_polynomial_gelu_fails():
    """matmul_divide_gelu: gelu((x@W + b) / 10) with gelu(u) ~ u/2 + u^2/sqrt(2 pi) (its
    second-order Taylor series), good to ~0.07 u^4: on the spec's draw |u| < 0.6. The check
    judges three seeds and fails a kernel on any one of them."""

    def polynomial(inputs):
        x, w, b = (f64(a) for a in inputs)
        u = (x @ w + b) / 10
        return u / 2 + u**2 / math.sqrt(2 * math.pi)

    rejected = judged("matmul_divide_gelu", polynomial)
    assert rejected[0] is False and rejected[1] is True and any(rejected[s] for s in STRUCTURED_SEEDS)


def test_bias_dropping_kernel_fails():
    """matmul_divide_gelu without its bias: the spec's N*0.02 bias moves (x@W + b)/10 by ~0.002."""

    def no_bias(inputs):
        x, w, _ = (f64(a) for a in inputs)
        return np.asarray(jax.nn.gelu(jnp.asarray((x @ w) / 10, jnp.float32)))

    assert judged("matmul_divide_gelu", no_bias) == {0: False, 1: True, 2: True}


def test_batchnorm_assuming_zero_mean_unit_variance_fails():
    """matmul_batchnorm_biasadd_divide_swish with the running mean taken as 0 and the running
    variance as 1 (the spec's constants): exact on seed 0."""

    def assumes_standard(inputs):
        x, w, lin_b, bn_scale, bn_bias, _, _, bias = (f64(a) for a in inputs)
        v = (x @ w + lin_b) * bn_scale + bn_bias + bias
        return np.asarray(jax.nn.swish(jnp.asarray(v, jnp.float32)))

    assert judged("matmul_batchnorm_biasadd_divide_swish", assumes_standard) == {0: False, 1: True, 2: True}


def test_rmsnorm_assuming_zero_mean_rows_fails():
    """rmsnorm normalising by the rows' variance, i.e. assuming their mean is zero (as it is,
    up to noise, in the spec's N(0,1) rows)."""

    def by_variance(inputs):
        x, scale = (f64(a) for a in inputs)
        return x / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * scale

    assert judged("rmsnorm", by_variance) == {0: False, 1: True, 2: True}


def test_triangle_ignoring_the_mask_fails():
    """triangle_multiplication with the mask taken as all ones (the spec's mask)."""
    w = workloads.get("triangle_multiplication")
    cfg = w.check_config()
    reference = jax.jit(lambda *a: w.reference(cfg, *a))

    def unmasked(inputs):
        pair_act, mask, *rest = inputs
        return np.asarray(reference(pair_act, jnp.ones_like(mask), *rest), np.float32)

    assert judged("triangle_multiplication", unmasked) == {0: False, 1: True, 2: True}
