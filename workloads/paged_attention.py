"""6p paged_attention: GQA decode over a paged KV cache, Llama-3.1-70B (MaxText), bf16.

Inputs (spec 6p): ``split(key(42), 5)`` -> queries (num_seqs, num_query_heads, head_dim)
N(0,1) from key 0, one decode token per sequence; k_pages and v_pages (num_seqs *
pages_per_seq, page_size, num_kv_heads, head_dim) from keys 1 and 2; kv_lens (num_seqs,)
i32, all max_seq_len; page_indices = arange reshaped (num_seqs, pages_per_seq), so
sequence i owns pages [i*pages_per_seq, (i+1)*pages_per_seq); cu_q_lens = arange(num_seqs+1).

Math, per sequence i: q = queries[cu_q_lens[i]] (num_query_heads, head_dim); K and V are
gathered from the pages page_indices[i] in order, (max_seq_len, num_kv_heads, head_dim),
and each KV head serves num_query_heads/num_kv_heads consecutive query heads;
s = q·kᵀ·head_dim^-0.5; key positions >= kv_lens[i] get -1e30; softmax; times v. All in
bf16 as JAXBench's baseline computes it. Output (num_seqs, num_query_heads, head_dim)
bf16, tolerance 1e-2/1e-2.

Input fixes (the math and shapes are JAXBench's):

* k_pages and v_pages are N(0,1), not N·0.02. With the 0.02 scale the scores are ~0.02,
  the softmax is flat, and the output is a mean of ~4096 values of std 0.02: its std is
  3e-4, 30x below atol (no output value exceeds it), so an all-zero output passed the
  check. Unscaled, the output's std is 0.026 at the full size and 0.07 at the check
  size, and 73% / 89% of its values exceed atol.
* Seed 0 keeps the spec's page table and lengths. Seeds >= 1 (the check's seeds 1 and 2)
  draw a fresh permutation of all pages as the page table (key 4) and kv_lens uniform in
  [1, max_seq_len] (key 3): with the spec's all-full lengths the length mask is vacuous
  (workloads.md section 5), and with its identity table a kernel that reads pages
  contiguously would pass. kv_lens are at least 1 (an empty sequence has no attention); one
  random sequence gets the whole page table and another at most one page.
* Seeds >= 1 also draw queries and k_pages with ``QK_STRUCTURE`` (per-dimension means, mild
  scales, correlated rows: scores at std ~1, within what the bf16 reference rounds) and
  v_pages fully structured (per-row and per-dimension means, scales, outliers) at a
  root-mean-square of 0.5 (``TIGHT_V_SCALE``: the bf16 reference errs in proportion; the
  jax expert used 0.92 of the tolerance at full scale).

JAXBench's signature (its optimized file, jax's kernel's convention) is accepted too:
``workload(q, k_pages, v_pages, lengths, page_indices)`` with one query row per sequence,
q = queries[cu_q_lens[:-1]] (no cu_q_lens), and head-major pages (num_kv_heads,
total_pages, page_size, head_dim). jax's kernel takes no softmax scale (its callers scale
q), so that q comes already multiplied by head_dim^-0.5. A candidate with that signature is
called through an adapter that gathers and scales those rows and transposes both page
arrays on every call (``jaxbench_signature``); the adapter's ops are part of the
candidate's priced program (each page array is read and written once more).

The check runs at num_seqs=4, num_query_heads=16, num_kv_heads=2, pages_per_seq=32
(max_seq_len 512), page_size 16, head_dim 128. Sequences and KV heads only repeat
independent problems; two KV heads with 8 query heads each (the full config's ratio) keep
the GQA head mapping checked. pages_per_seq stays a multiple of the largest page block in
the space (32), so every schedule runs with its own tiling, and the random lengths of
seeds 1-2 end mid-page and mid-block. Interpret mode pays for every DMA, and both the
template and jax's kernel issue one per page (jax's: per page and KV head, and a wait
each), which is what bounds the number of pages checked (~1 s per seed for the template).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import (
    Knob,
    ScheduleSpace,
    QK_STRUCTURE,
    TIGHT_V_SCALE,
    Workload,
    indivisible,
    over_vmem,
    require_positive_ints,
    seeded_normal,
    tile_bytes,
)
from .essential import referenced_tokens, spec_arrays

PAGE_BLOCKS = (4, 8, 16, 32)
MASK_VALUE = -1e30


class PagedAttention(Workload):
    name = "paged_attention"
    jaxbench_id = "6p"
    category = "attention (paged)"
    description = "GQA decode attention over a paged KV cache, 64 seqs x 4096 keys, 64/8 heads, bf16"
    defaults = {"num_seqs": 64, "max_seq_len": 4096, "num_query_heads": 64, "num_kv_heads": 8,
                "head_dim": 128, "page_size": 16, "pages_per_seq": 256, "dtype": "bfloat16"}
    check_overrides = {"num_seqs": 4, "num_query_heads": 16, "num_kv_heads": 2, "pages_per_seq": 32,
                       "max_seq_len": 512}
    atol = 1e-2
    rtol = 1e-2
    template_file = "paged_attention.py"
    expert_file = "paged_attention.py"

    def check_config(self):
        out = super().check_config()
        out["max_seq_len"] = out["pages_per_seq"] * out["page_size"]
        # keep the full config's query heads per KV head
        out["num_query_heads"] = out["num_kv_heads"] * (self.config["num_query_heads"] // self.config["num_kv_heads"])
        return out

    def jaxbench_signature(self, config):
        # JAXBench's optimized file: workload(q, k_pages, v_pages, lengths, page_indices), the
        # calling convention of jax's paged_attention kernel (see the module docstring).
        def adapt(queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
            head_major = (2, 0, 1, 3)  # (total_pages, page_size, kv_heads, d) -> (kv_heads, total_pages, page_size, d)
            q = (queries[cu_q_lens[:-1]].astype(jnp.float32) * queries.shape[-1] ** -0.5).astype(queries.dtype)
            return (q, jnp.transpose(k_pages, head_major), jnp.transpose(v_pages, head_major), kv_lens, page_indices)

        return 5, adapt

    def validate_config(self, config):
        keys = ("num_seqs", "max_seq_len", "num_query_heads", "num_kv_heads", "head_dim", "page_size", "pages_per_seq")
        require_positive_ints(self.name, config, keys)
        if config["max_seq_len"] != config["page_size"] * config["pages_per_seq"]:
            raise ValueError(f"{self.name}: max_seq_len={config['max_seq_len']} must equal page_size * pages_per_seq "
                             f"= {config['page_size'] * config['pages_per_seq']}")
        if config["num_query_heads"] % config["num_kv_heads"]:
            raise ValueError(f"{self.name}: num_query_heads={config['num_query_heads']} must be a multiple of "
                             f"num_kv_heads={config['num_kv_heads']}")
        if (config["num_query_heads"] // config["num_kv_heads"]) % 8:
            raise ValueError(f"{self.name}: query heads per KV head must be a multiple of 8 (a sublane tile)")
        if config["head_dim"] % 128:
            raise ValueError(f"{self.name}: head_dim={config['head_dim']} must be a multiple of 128 (the lane width)")
        if config["page_size"] % 16:
            raise ValueError(f"{self.name}: page_size={config['page_size']} must be a multiple of 16 "
                             "(a bf16 sublane tile, so pages land tile-aligned in VMEM)")
        if config["pages_per_seq"] % PAGE_BLOCKS[0]:
            raise ValueError(f"{self.name}: pages_per_seq={config['pages_per_seq']} must be a multiple of "
                             f"{PAGE_BLOCKS[0]} (the smallest page block)")
        if str(config.get("dtype", "bfloat16")) not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"{self.name}: dtype {config['dtype']!r} is not a float dtype")

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        n, pps, ps = config["num_seqs"], config["pages_per_seq"], config["page_size"]
        hkv, d = config["num_kv_heads"], config["head_dim"]
        total = n * pps
        keys = jax.random.split(jax.random.key(42 + seed), 5)
        queries = seeded_normal(keys[0], (n, config["num_query_heads"], d), dt, seed, **QK_STRUCTURE)
        k_pages = seeded_normal(keys[1], (total, ps, hkv, d), dt, seed, **QK_STRUCTURE)
        v_pages = seeded_normal(keys[2], (total, ps, hkv, d), dt, seed, scale=1.0 if seed == 0 else TIGHT_V_SCALE)
        if seed == 0:
            kv_lens = jnp.full((n,), config["max_seq_len"], jnp.int32)
            page_indices = jnp.arange(total, dtype=jnp.int32).reshape(n, pps)
        else:
            k_len, k_short, k_which = jax.random.split(keys[3], 3)
            kv_lens = jax.random.randint(k_len, (n,), 1, config["max_seq_len"] + 1, jnp.int32)
            full, short = jax.random.choice(k_which, n, (2,), replace=n < 2)  # one full table, one short
            kv_lens = kv_lens.at[full].set(config["max_seq_len"])
            kv_lens = kv_lens.at[short].set(jax.random.randint(k_short, (), 1, ps + 1, jnp.int32))
            page_indices = jax.random.permutation(keys[4], total, independent=True).astype(jnp.int32).reshape(n, pps)
        cu_q_lens = jnp.arange(n + 1, dtype=jnp.int32)
        return queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens

    def reference(self, config, queries, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
        # JAXBench's baseline: one sequence at a time under vmap, everything in bf16.
        hq, hkv, d = config["num_query_heads"], config["num_kv_heads"], config["head_dim"]
        max_seq_len = config["pages_per_seq"] * config["page_size"]
        sm_scale = d**-0.5

        def attend_one_seq(i):
            q = jax.lax.dynamic_slice(queries, (cu_q_lens[i], 0, 0), (1, hq, d))
            pages = page_indices[i]
            k = jnp.repeat(k_pages[pages].reshape(max_seq_len, hkv, d), hq // hkv, axis=1)
            v = jnp.repeat(v_pages[pages].reshape(max_seq_len, hkv, d), hq // hkv, axis=1)
            attn = jnp.einsum("qhd,khd->hqk", q, k) * sm_scale
            mask = jnp.arange(max_seq_len) < kv_lens[i]
            attn = jnp.where(mask[None, None, :], attn, MASK_VALUE)
            attn = jax.nn.softmax(attn, axis=-1)
            return jnp.einsum("hqk,khd->qhd", attn, v).squeeze(0)

        return jax.vmap(attend_one_seq)(jnp.arange(config["num_seqs"]))

    def essential_work(self, config):
        # Only the KV tokens some sequence references (t < kv_len, through its page table; at
        # seed 0 all of them) are read and scored, and only the query rows cu_q_lens points at.
        kv_lens, pages, cu = spec_arrays(self, config, lambda q, k, v, kv_lens, pages, cu: (kv_lens, pages, cu))
        n, hq, hkv, d, ps = (config[k] for k in ("num_seqs", "num_query_heads", "num_kv_heads", "head_dim",
                                                  "page_size"))
        itemsize = self.dtype(config).itemsize
        nbytes = (2 * referenced_tokens(pages, kv_lens[:n], ps) * hkv * d * itemsize  # K and V
                  + (np.unique(cu[:n]).size + n) * hq * d * itemsize  # the query rows read, the output
                  + kv_lens.nbytes + pages.nbytes + cu.nbytes)
        return float(nbytes), 2.0 * 2 * hq * d * float(kv_lens[:n].sum())

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        d, ps, hkv, hq = config["head_dim"], config["page_size"], config["num_kv_heads"], config["num_query_heads"]
        dims = {"pages_per_block": ("pages_per_seq", config["pages_per_seq"])}

        def check(s):
            block_len = s["pages_per_block"] * ps
            vmem = (
                2 * s["buffers"] * block_len * tile_bytes((hkv, d), dt)  # k and v page buffers
                + 4 * tile_bytes((hq, d), dt)  # q and o blocks, double-buffered
                + 2 * tile_bytes((hq, 128), "float32") + tile_bytes((hq, d), "float32")  # m, l, acc
                + 2 * tile_bytes((hq // hkv, block_len), "float32")  # scores and exp(scores) of one KV head
            )
            return indivisible(dims, s) or over_vmem(vmem)

        return ScheduleSpace(
            [
                Knob("pages_per_block", PAGE_BLOCKS, 32, "KV pages gathered and scored per grid step"),
                Knob("buffers", (1, 2), 2, "page buffers: 2 starts the next step's page DMAs before this step waits"),
            ],
            check,
        )
