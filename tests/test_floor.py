"""The physical floor (``Workload.essential_work``): no prediction is below the workload's
essential HBM bytes and MXU FLOPs at v6e's peaks. The floor must never exceed what an honest
optimal kernel needs, so:

1. it is at most every published v6e measurement (the XLA baseline and the expert kernels);
2. the overrides count what a correct kernel must do, exactly: the causal pairs of the
   attentions, the routed experts of the MoE, the rows in megablox's groups, the referenced KV
   tokens of the paged attentions, the recurrent form of the linear ones, the shortcuts of the
   KernelBench workloads (26k's dead GEMM, 21k/23k's mat-vec, 49k's pooled matmul, 28k's
   transposed conv without the inserted zeros);
3. every workload's floor at its full and check sizes writes at least its output.

Fast: shapes are traced, only small integer inputs (and 10p's routing) are built.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workloads
from jaxbench_env.sim.hardware import V6E
from workloads.base import Workload
from workloads.essential import causal_pairs, io_avals, spec_arrays
from workloads.ragged_paged_attention import scenario

PUBLISHED = Path(__file__).parent.parent / "jaxbench_env" / "data" / "jaxbench_v6e_published.csv"
BY_ID = {cls.jaxbench_id: cls for cls in workloads.WORKLOADS.values()}
# Every workload the published file names is in the suite: no row is excluded.
EXCLUDED_ROWS: dict[str, str] = {}


def essential(name: str, check: bool = False) -> tuple[float, float]:
    return _work(name, bool(check), False)


def default(name: str, check: bool = False) -> tuple[float, float]:
    """The base class's count: every input and output once, the reference's matmul FLOPs."""
    return _work(name, bool(check), True)


@functools.cache
def _work(name: str, check: bool, base: bool) -> tuple[float, float]:
    wl = workloads.get(name)
    config = wl.check_config() if check else wl.config
    return Workload.essential_work(wl, config) if base else wl.essential_work(config)


def floor_ms(name: str) -> float:
    return V6E.floor_s(*essential(name)) * 1e3


def with_seed(wl, seed: int):
    """``wl`` with its spec inputs (seed 0) replaced by seed ``seed``'s ragged ones."""
    make = type(wl).make_inputs
    wl.make_inputs = lambda config, s: make(wl, config, seed if s == 0 else s)
    return wl


# --- 1. never above a real measurement ------------------------------------------------------


def published_rows():
    with PUBLISHED.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", published_rows(), ids=lambda r: f"{r['workload']}-{r['variant']}")
def test_floor_is_at_most_the_published_time(row):
    jid = row["workload"].split("_", 1)[0]
    if row["workload"] in EXCLUDED_ROWS:
        pytest.skip(EXCLUDED_ROWS[row["workload"]])
    assert jid in BY_ID, f"{row['workload']} is not in the suite; exclude it by name with a reason"
    name = BY_ID[jid].name
    assert floor_ms(name) <= float(row["median_ms"]), (name, floor_ms(name), row)


def test_every_published_row_is_checked():
    rows = published_rows()
    assert len(rows) == 33
    assert all(r["workload"].split("_", 1)[0] in BY_ID or r["workload"] in EXCLUDED_ROWS for r in rows)


# --- 2. the overrides ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["flash_attention", "gqa_attention", "sparse_attention", "flex_attention"])
def test_causal_attention_counts_the_pairs_at_or_below_the_diagonal(name):
    s = workloads.get(name).config["seq_len"]
    (nbytes, flops), (nbytes0, flops0) = essential(name), default(name)
    assert causal_pairs(s) == s * (s + 1) // 2
    assert flops == pytest.approx(flops0 * (s + 1) / (2 * s), rel=1e-12)  # 0.500122 at 4096
    if name == "flex_attention":  # the masked half of the bias is never read
        h = workloads.get(name).config["num_heads"]
        assert nbytes == nbytes0 - h * (s * s - causal_pairs(s)) * 2
    else:
        assert nbytes == nbytes0


def test_mla_counts_projections_in_full_and_the_attention_causally():
    c = workloads.get("mla_attention").config
    b, h, s = c["batch"], c["num_heads"], c["seq_len"]
    dims = c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]
    (nbytes, flops), (nbytes0, flops0) = essential("mla_attention"), default("mla_attention")
    assert nbytes == nbytes0
    assert flops0 - flops == pytest.approx(2 * b * h * (s * s - causal_pairs(s)) * dims, rel=1e-12)


def test_retnet_needs_causal_scores_and_a_recurrent_numerator():
    wl = workloads.get("retnet_retention")
    c = wl.check_config()  # seq 1024: no decay underflows there
    b, h, s, d = c["batch"], c["num_heads"], c["seq_len"], c["head_dim"]
    p = causal_pairs(s)
    assert wl.essential_work(c)[1] == b * h * (2 * d * p + min(2 * d * p, 4 * s * d * d))
    c = wl.config  # at 4096 only head 0's decay underflows, past ~2750 positions
    b, h, s, d = c["batch"], c["num_heads"], c["seq_len"], c["head_dim"]
    full = b * h * (2 * d * causal_pairs(s) + 4 * s * d * d)
    assert 0.99 * full < essential("retnet_retention")[1] < full < default("retnet_retention")[1] / 3


def test_mamba2_counts_the_recurrent_form():
    c = workloads.get("mamba2_ssd").config
    b, h, s, d = c["batch"], c["num_heads"], c["seq_len"], c["head_dim"]
    assert essential("mamba2_ssd") == (default("mamba2_ssd")[0], 4.0 * b * h * s * d * d)
    assert essential("mamba2_ssd")[1] < default("mamba2_ssd")[1] / 32


def test_paged_attention_reads_only_referenced_tokens():
    assert essential("paged_attention") == default("paged_attention")  # seed 0: every page, full lengths
    wl = with_seed(workloads.get("paged_attention"), 1)  # random lengths and page table
    c = wl.check_config()
    kv_lens = spec_arrays(wl, c, lambda *inputs: inputs[3])
    nbytes, flops = wl.essential_work(c)
    assert flops == 2 * 2 * c["num_query_heads"] * c["head_dim"] * kv_lens.sum()
    pages_bytes = 2 * aval_bytes_of(wl, c, 1)
    token_bytes = 2 * c["num_kv_heads"] * c["head_dim"] * 2
    assert nbytes == Workload.essential_work(wl, c)[0] - pages_bytes + token_bytes * kv_lens.sum()


def aval_bytes_of(wl, config, index):
    a = io_avals(wl, config)[0][index]
    return math.prod(a.shape) * a.dtype.itemsize


@pytest.mark.parametrize("check", [False, True])
def test_ragged_paged_attention_counts_the_causal_pairs_by_brute_force(check):
    wl = workloads.get("ragged_paged_attention")
    c = wl.check_config() if check else wl.config
    pairs = tokens = 0
    for q_len, kv_len in zip(*scenario(c)):
        position = kv_len - q_len + np.arange(q_len)[:, None]  # the reference's mask, row by row
        t = np.arange(c["pages_per_seq"] * c["page_size"])[None, :]
        pairs += int(((t <= position) & (t < kv_len)).sum())
        tokens += kv_len  # the page table is a permutation: no page is shared
    nbytes, flops = wl.essential_work(c)
    assert flops == 2 * 2 * c["num_q_heads"] * c["head_dim"] * pairs
    qo = 2 * c["max_num_batched_tokens"] * c["num_q_heads"] * c["head_dim"] * 2
    ints = 4 * (c["max_num_seqs"] * (c["pages_per_seq"] + 2) + 2)
    assert nbytes == tokens * 2 * c["num_kv_heads"] * c["head_dim"] * 2 + qo + ints
    if not check:
        assert nbytes < 0.6 * default("ragged_paged_attention")[0]


def test_mixtral_runs_only_the_routed_experts():
    c = workloads.get("mixtral_moe").config
    t, d, f, e, k = (c["batch"] * c["seq_len"], c["emb_dim"], c["mlp_dim"], c["num_experts"],
                     c["num_experts_per_tok"])
    nbytes, flops = essential("mixtral_moe")
    assert flops == 2 * t * d * e + t * k * 3 * 2 * d * f
    assert flops < default("mixtral_moe")[1] * k / e + 2 * t * d * e
    assert nbytes == default("mixtral_moe")[0]  # every expert gets tokens at seed 0


def test_megablox_multiplies_only_the_rows_in_groups():
    c = workloads.get("megablox_gmm").config
    m, k, n = c["seq_len"] * c["num_experts_per_tok"], c["emb_dim"], c["moe_mlp_dim"]
    assert essential("megablox_gmm") == default("megablox_gmm")  # seed 0: uniform groups fill the windows
    assert essential("megablox_gmm")[1] == 2 * k * n * m
    wl = with_seed(workloads.get("megablox_gmm"), 1)  # ragged sizes, some groups empty
    c = wl.check_config()
    sizes = spec_arrays(wl, c, lambda *inputs: inputs[2])
    m, k, n = c["seq_len"] * c["num_experts_per_tok"], c["emb_dim"], c["moe_mlp_dim"]
    assert 0 < sizes.sum() < m and (sizes == 0).any()
    nbytes, flops = wl.essential_work(c)
    assert flops == 2 * k * n * sizes.sum()
    assert nbytes == 2 * (sizes.sum() * k + (sizes > 0).sum() * k * n + m * n) + 4 * sizes.size


def test_kernelbench_shortcuts():
    by_id = {cls.jaxbench_id: cls.name for cls in workloads.WORKLOADS.values()}
    # 26k: the GEMM is dead: neither x nor W (nor b, in_weight) is read, no FLOPs.
    c = workloads.get(by_id["26k"]).config
    m, kk, n = c["batch_size"], c["in_features"], c["out_features"]
    assert essential(by_id["26k"]) == (2.0 * (m * n + n + m * n), 0.0)  # y, in_bias; the output
    assert essential(by_id["26k"])[0] < default(by_id["26k"])[0] - 2 * n * kk  # W excluded
    # 21k, 23k: the row sum of x @ W.T is a mat-vec with W's column sums.
    for jid, k_key in (("21k", "input_size"), ("23k", "in_features")):
        c = workloads.get(by_id[jid]).config
        assert essential(by_id[jid]) == (default(by_id[jid])[0], 2.0 * c["batch_size"] * c[k_key])
    # 49k: the average pool commutes with the matmul.
    c = workloads.get(by_id["49k"]).config
    assert essential(by_id["49k"]) == (default(by_id["49k"])[0], default(by_id["49k"])[1] / c["pool_kernel_size"])
    # 22k: conv_bias cancels in the InstanceNorm.
    assert essential(by_id["22k"]) == (default(by_id["22k"])[0] - 2 * 128, default(by_id["22k"])[1])


def test_conv_transpose_counts_only_taps_inside_the_output():
    name = "convtranspose3d_layernorm_gelu_scaling"
    c = workloads.get(name).config
    k, s, p = c["kernel_size"], c["stride"], c["padding"]
    x = jnp.ones((1, 1, c["depth"], c["height"], c["width"]), jnp.float32)
    w = jnp.ones((1, 1, k, k, k), jnp.float32)
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NCDHW", "OIDHW", "NCDHW"))
    y = jax.lax.conv_general_dilated(x, w, (1, 1, 1), [(k - 1 - p, k - 1 - p)] * 3, lhs_dilation=(s, s, s),
                                     dimension_numbers=dn)  # the reference's conv, on ones
    taps = float(y.sum())  # (input, tap) products inside the output
    macs = c["batch_size"] * c["in_channels"] * c["out_channels"] * taps
    nbytes, flops = essential(name)
    assert (nbytes, flops) == (default(name)[0], 2 * macs)
    assert flops < default(name)[1] / 8


# --- 3. every workload, full and check size ----------------------------------------------------

@pytest.mark.parametrize("check", [False, True], ids=["full", "check"])
@pytest.mark.parametrize("name", sorted(workloads.WORKLOADS))
def test_floor_writes_the_output_and_never_exceeds_the_default(name, check):
    wl = workloads.get(name)
    config = wl.check_config() if check else wl.config
    nbytes, flops = essential(name, check)
    out_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in io_avals(wl, config)[1])
    assert math.isfinite(nbytes) and math.isfinite(flops)
    assert nbytes >= out_bytes and flops >= 0
    nbytes0, flops0 = default(name, check)
    assert nbytes <= nbytes0 and flops <= flops0
