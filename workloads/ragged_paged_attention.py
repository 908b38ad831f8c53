"""7p ragged_paged_attention: mixed prefill and decode over a shuffled paged KV cache,
Llama-3.1-70B serving (JAX Pallas RPA), bf16.

Inputs (spec 7p): ``split(key(42), 3)`` -> queries (max_num_batched_tokens, num_q_heads,
head_dim) N(0,1); kv_pages (max_num_seqs * pages_per_seq, page_size, 2 * num_kv_heads,
head_dim) N(0,1), unscaled, whose combined head axis interleaves K (index 2h) and V
(2h + 1) of KV head h; page_indices = ``permutation(key 3, total pages, independent=True)``
reshaped (max_num_seqs, pages_per_seq): unique, in bounds, non-contiguous. Then kv_lens
(max_num_seqs,), cu_q_lens (max_num_seqs + 1,) and num_seqs (1,), int32, from the scenario.

Math (the general semantics, workloads.md section 7: any num_seqs, any q_len and kv_len
within the page table), for each sequence i < num_seqs[0], q_len = cu[i+1] - cu[i]: its
query rows cu[i] ... cu[i+1]-1; key/value position t at page page_indices[i, t // page_size],
slot t % page_size; each KV head serves num_q_heads / num_kv_heads consecutive query
heads; scores in f32 times head_dim^-0.5; query row r sits at position kv_len - q_len + r
and masks keys t > that position or t >= kv_len with -0.7 * float32 max; softmax in f32,
cast to bf16, times v. Rows no sequence owns stay zero. Output (max_num_batched_tokens,
num_q_heads, head_dim) bf16, tolerance 1e-2/1e-2.

The reference generalises JAXBench's baseline, which only handles its shipped scenario
(static per-slot query capacities, slots past 56 never computed): for every slot,
unrolled as in JAXBench (slots past num_seqs do nothing), a loop walks the slot's query
rows in chunks of 64, cdiv(q_len, 64) of them; the per-chunk math, dtypes and ops are
JAXBench's. XLA's cost analysis counts a loop body once, so the simulator prices one
64-row chunk per slot (4096 rows over 64 slots, about JAXBench's own work) while the real
loop runs 112 chunks here; a rolled slot loop would be priced at a single chunk.

Scenario (``scenario(config)``, pure Python, from the config; the spec's at full size):
of S = max_num_seqs slots, 3S/4 decode sequences (q_len 1) come first, then S/8 prefill
chunks of q_len T/(S/8) (T = max_num_batched_tokens), the last one shortened so the
query lengths sum to exactly T; the last S/8 slots are inactive (kv_len 0, cu_q_lens
padded with T). With K = pages_per_seq * page_size, decode i has kv_len
K/16 + 1 + ((73 i) mod ((K - K/16) / page_size)) * page_size (at full size
257 + ((73 i) mod 240) * 16, in [257, 4081], always one past a page boundary) and prefill
j has kv_len min((j + 2) * chunk, K) - 1 (1023, 1535, ..., 4095, 4095). Full size: 48
decodes, 7 x 512 + 464 prefill tokens, 56 of 64 slots.

Seeds other than 0 (the check's) draw a fresh page permutation and a random batch
(``random_scenario``: half to all slots active, decodes, prefill chunks and sequences with
no query tokens in random order and of random lengths), so a kernel tuned to the scenario's
layout fails; queries and K are drawn with ``QK_STRUCTURE`` (per-dimension means, mild
scales, correlated rows), which keeps scores at std ~1 where the bf16 reference is exact
enough, and V fully structured (per-row and per-dimension means, scales, outliers).

The check runs at max_num_batched_tokens=256, max_num_seqs=16, num_q_heads=16,
num_kv_heads=2, pages_per_seq=32 (page_size 16, head_dim 128): the scenario there has 12
decodes with kv_len in [33, 465], prefill chunks of 128 and 116 query tokens with kv_len
255 and 383, and 2 inactive slots. Decode and prefill stay mixed, no length is a multiple
of a page or a block, the 116-token chunk ends mid q-block, and the q blocks of the space
(up to 128 tokens) and kv blocks (up to 32 pages) tile the token axis and the page table.
Two KV heads with 8 query heads each keep the GQA mapping and the K/V interleave checked.
The page table stays small because interpret mode's cost per DMA grows with the size of
the paged array (1-2 s per seed here; ~12 s at 64 pages per slot).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import (
    Knob,
    ScheduleSpace,
    QK_STRUCTURE,
    Workload,
    indivisible,
    over_vmem,
    require_positive_ints,
    seeded_normal,
    tile_bytes,
)
from .essential import causal_pairs, referenced_tokens, spec_arrays

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
ROW_CHUNK = 64  # query rows per step of the reference's per-sequence loop
Q_BLOCKS = (16, 32, 64, 128)
PAGE_BLOCKS = (4, 8, 16, 32)


def scenario(config) -> tuple[list[int], list[int]]:
    """(q_lens, kv_lens) of the active sequences, decodes first then prefill chunks."""
    slots, tokens = config["max_num_seqs"], config["max_num_batched_tokens"]
    page, max_kv = config["page_size"], config["pages_per_seq"] * config["page_size"]
    n_decode, n_prefill = 3 * slots // 4, slots // 8
    chunk = tokens // n_prefill
    q_lens = [1] * n_decode + [chunk] * (n_prefill - 1) + [tokens - n_decode - (n_prefill - 1) * chunk]
    span = (max_kv - max_kv // 16) // page
    kv_lens = ([max_kv // 16 + 1 + ((73 * i) % span) * page for i in range(n_decode)]
               + [min((j + 2) * chunk, max_kv) - 1 for j in range(n_prefill)])
    return q_lens, kv_lens


def random_scenario(config, key) -> tuple[list[int], list[int]]:
    """(q_lens, kv_lens) of a random batch: from max_num_seqs/2 to all slots active, each a
    decode (q_len 1, probability 0.6), a prefill chunk (0.3) or a sequence with no query
    tokens this step (0.1); the chunks share what the decodes leave of the token budget at
    random (together 60-100% of it), and every kv_len is uniform in [max(q_len, 1), max_kv]."""
    slots, tokens = config["max_num_seqs"], config["max_num_batched_tokens"]
    max_kv = config["pages_per_seq"] * config["page_size"]
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
    active = int(rng.integers(slots // 2, slots + 1))
    kind = rng.choice(3, active, p=[0.6, 0.3, 0.1])  # decode, prefill, no queries
    q_lens = np.where(kind == 0, 1, 0)
    chunks = np.flatnonzero(kind == 1)
    if len(chunks):
        budget = (tokens - q_lens.sum()) * rng.uniform(0.6, 1.0)
        q_lens[chunks] = np.maximum(1, np.floor(rng.dirichlet(np.ones(len(chunks))) * budget)).astype(int)
    q_lens = np.minimum(q_lens, max_kv)
    while q_lens.sum() > tokens:  # chunks of at least 1 token can overrun a tight budget
        q_lens[np.argmax(q_lens)] -= 1
    kv_lens = [int(rng.integers(max(q, 1), max_kv + 1)) for q in q_lens]
    return [int(q) for q in q_lens], kv_lens


def template_limit(config) -> str | None:
    """Why the template cannot serve ``config`` (a config the reference runs), or None."""
    per_kv = config["num_q_heads"] // config["num_kv_heads"]
    if per_kv % 8:
        return (f"the template needs num_q_heads / num_kv_heads a multiple of 8 (the query heads of one KV "
                f"head fill a sublane tile); got {per_kv}")
    if config["head_dim"] % 128:
        return f"the template needs head_dim a multiple of 128 (the lane width); got {config['head_dim']}"
    if config["page_size"] % 16:
        return f"the template needs page_size a multiple of 16 (a bf16 tile); got {config['page_size']}"
    for key, blocks in (("max_num_batched_tokens", Q_BLOCKS), ("pages_per_seq", PAGE_BLOCKS)):
        if config[key] % blocks[0]:
            return f"the template needs {key} a multiple of {blocks[0]} (its smallest block); got {config[key]}"
    return None


class RaggedPagedAttention(Workload):
    name = "ragged_paged_attention"
    jaxbench_id = "7p"
    category = "attention (ragged, paged)"
    description = ("mixed prefill+decode attention over a shuffled paged KV cache, 4096 tokens, "
                   "56 of 64 seqs, 64/8 heads, bf16")
    defaults = {"max_num_batched_tokens": 4096, "max_num_seqs": 64, "num_q_heads": 64, "num_kv_heads": 8,
                "head_dim": 128, "page_size": 16, "pages_per_seq": 256, "dtype": "bfloat16"}
    check_overrides = {"max_num_batched_tokens": 256, "max_num_seqs": 16, "num_q_heads": 16, "num_kv_heads": 2,
                       "pages_per_seq": 32}
    atol = 1e-2
    rtol = 1e-2
    template_file = "ragged_paged_attention.py"
    expert_file = "ragged_paged_attention.py"
    # jax's TPU interpreter cannot run the shipped kernel (it reshapes and bitcasts refs).
    expert_checks_on_cpu = False

    def check_config(self):
        out = super().check_config()
        # keep the full config's query heads per KV head
        out["num_q_heads"] = out["num_kv_heads"] * (self.config["num_q_heads"] // self.config["num_kv_heads"])
        return out

    def validate_config(self, config):
        keys = ("max_num_batched_tokens", "max_num_seqs", "num_q_heads", "num_kv_heads", "head_dim", "page_size",
                "pages_per_seq")
        require_positive_ints(self.name, config, keys)
        if config["num_q_heads"] % config["num_kv_heads"]:
            raise ValueError(f"{self.name}: num_q_heads={config['num_q_heads']} must be a multiple of "
                             f"num_kv_heads={config['num_kv_heads']} (grouped-query attention)")
        slots, tokens = config["max_num_seqs"], config["max_num_batched_tokens"]
        if slots % 8 or tokens % (slots // 8):
            raise ValueError(f"{self.name}: the scenario needs max_num_seqs a multiple of 8 (got {slots}) and "
                             f"max_num_batched_tokens a multiple of max_num_seqs/8 (got {tokens})")
        q_lens, kv_lens = scenario(config)
        max_kv = config["pages_per_seq"] * config["page_size"]
        if q_lens[-1] < 1 or max_kv // 16 < 1 or any(not q <= kv <= max_kv for q, kv in zip(q_lens, kv_lens)):
            raise ValueError(f"{self.name}: the scenario does not fit this config: prefill chunks of "
                             f"{q_lens[-2] if len(q_lens) > 1 else q_lens[0]} tokens after {3 * slots // 4} decodes "
                             f"need kv_len >= q_len and kv_len <= pages_per_seq * page_size = {max_kv}")
        if str(config.get("dtype", "bfloat16")) not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"{self.name}: dtype {config['dtype']!r} is not a float dtype")

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        slots, pps = config["max_num_seqs"], config["pages_per_seq"]
        total = slots * pps
        k1, k2, k3 = jax.random.split(jax.random.key(42 + seed), 3)
        queries = seeded_normal(k1, (config["max_num_batched_tokens"], config["num_q_heads"], config["head_dim"]),
                                dt, seed, **QK_STRUCTURE)
        pages = (total, config["page_size"], 2 * config["num_kv_heads"], config["head_dim"])
        if seed == 0:
            kv_pages = jax.random.normal(k2, pages, dt)
        else:  # K (combined heads 2h) with QK_STRUCTURE, V (2h + 1) fully structured
            kk, kv = jax.random.split(k2)
            half = (total, config["page_size"], config["num_kv_heads"], config["head_dim"])
            k = seeded_normal(kk, half, dt, seed, **QK_STRUCTURE)
            kv_pages = jnp.stack([k, seeded_normal(kv, half, dt, seed)], axis=3).reshape(pages)
        page_indices = jax.random.permutation(k3, total, independent=True).astype(jnp.int32).reshape(slots, pps)
        q_lens, kv_lens = scenario(config) if seed == 0 else random_scenario(config, jax.random.fold_in(k3, 1))
        active = len(q_lens)
        kv = jnp.asarray(kv_lens + [0] * (slots - active), jnp.int32)
        cu = np.concatenate([[0], np.cumsum(q_lens)])
        cu_q_lens = jnp.asarray(np.concatenate([cu, np.full(slots - active, cu[-1])]), jnp.int32)
        num_seqs = jnp.asarray([active], jnp.int32)
        return queries, kv_pages, kv, page_indices, cu_q_lens, num_seqs

    def reference(self, config, queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        tokens, hq, d = queries.shape
        _, page_size, hc, _ = kv_pages.shape
        hkv = hc // 2
        slots, pages_per_seq = page_indices.shape
        max_kv = pages_per_seq * page_size
        sm_scale = d**-0.5
        chunk = min(ROW_CHUNK, tokens)
        kv_span = jnp.arange(max_kv, dtype=jnp.int32)

        output = jnp.zeros_like(queries)
        for i in range(slots):  # unrolled like JAXBench's, so XLA's cost analysis sees every slot
            q_start = cu_q_lens[i]
            q_len = cu_q_lens[i + 1] - q_start
            kv_len = kv_lens[i]
            pages = kv_pages[page_indices[i]]
            k = jnp.repeat(pages[:, :, 0::2, :].reshape(max_kv, hkv, d), hq // hkv, axis=1)
            v = jnp.repeat(pages[:, :, 1::2, :].reshape(max_kv, hkv, d), hq // hkv, axis=1)

            def rows_chunk(c, output, q_start=q_start, q_len=q_len, kv_len=kv_len, k=k, v=v):
                offsets = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
                rows = jnp.minimum(q_start + offsets, tokens - 1)
                attn = jnp.einsum("qhd,khd->hqk", queries[rows], k, preferred_element_type=jnp.float32)
                attn *= sm_scale
                q_span = kv_len - q_len + offsets
                mask = (q_span[:, None] < kv_span[None, :]) | (kv_span[None, :] >= kv_len)
                attn = jnp.where(mask[None], MASK_VALUE, attn)
                attn = jax.nn.softmax(attn, axis=-1).astype(v.dtype)
                out = jnp.einsum("hqk,khd->qhd", attn, v).astype(queries.dtype)
                out = jnp.where((offsets < q_len)[:, None, None], out, 0.0)
                return output.at[rows].add(out)

            n_chunks = jnp.where(i < num_seqs[0], (q_len + chunk - 1) // chunk, 0)
            output = jax.lax.fori_loop(0, n_chunks, rows_chunk, output)
        return output

    def essential_work(self, config):
        # Per active sequence with queries: its query rows, the KV tokens t < kv_len through its
        # page table, and QKᵀ and PV for the causal pairs only (row r sees t <= kv_len - q_len + r).
        kv_lens, pages, cu, num_seqs = spec_arrays(self, config, lambda q, kv, *ints: ints)
        hq, hkv, d, ps = (config[k] for k in ("num_q_heads", "num_kv_heads", "head_dim", "page_size"))
        itemsize = self.dtype(config).itemsize
        q_lens = np.diff(cu)[:num_seqs[0]]
        live = np.flatnonzero(q_lens > 0)
        pairs = sum(causal_pairs(int(q_lens[i]), int(kv_lens[i])) for i in live)
        nbytes = (2 * hkv * d * itemsize * referenced_tokens(pages[live], kv_lens[live], ps)  # K and V
                  + (q_lens.sum() + config["max_num_batched_tokens"]) * hq * d * itemsize  # query rows, output
                  + kv_lens.nbytes + pages.nbytes + cu.nbytes + num_seqs.nbytes)
        return float(nbytes), 2.0 * 2 * hq * d * pairs

    def _schedule_space(self, config):
        """Every schedule is illegal (with the reason) for a config the template cannot serve."""
        dt = str(jnp.dtype(config["dtype"]))
        d, ps, hkv, hq = config["head_dim"], config["page_size"], config["num_kv_heads"], config["num_q_heads"]
        dims = {"q_block": ("max_num_batched_tokens", config["max_num_batched_tokens"]),
                "pages_per_block": ("pages_per_seq", config["pages_per_seq"])}

        limit = template_limit(config)

        def check(s):
            if limit:
                return limit
            if s["kv_load"] == "words" and jnp.dtype(config["dtype"]).itemsize != 2:
                return f"kv_load=words pairs 16-bit K and V rows in 32-bit words, not {dt}"
            bq, block_len = s["q_block"], s["pages_per_block"] * ps
            rows = bq * (hq // hkv)  # one KV head's query rows
            vmem = (
                s["buffers"] * block_len * tile_bytes((2 * hkv, d), dt)  # combined k/v page buffers
                + 4 * bq * tile_bytes((hq, d), dt)  # q and o blocks, double-buffered
                + 2 * bq * tile_bytes((hq, d), "float32")  # acc and the f32 copy of q
                + 2 * hkv * tile_bytes((rows, 128), "float32")  # m, l
                # (rows, block_len) temporaries of one KV head: positions, mask, scores, exp
                + 6 * tile_bytes((rows, block_len), "float32")
            )
            # Calibrated on v6e compiles at the full size: q_block=128 with 16 pages (32.0 MiB
            # estimated) compiles; with 32 pages (38-40 MiB) it runs out of scoped VMEM.
            return indivisible(dims, s) or over_vmem(vmem)

        return ScheduleSpace(
            [
                Knob("q_block", Q_BLOCKS, 32, "query tokens per grid step (each step walks the sequences they belong to)"),
                Knob("pages_per_block", PAGE_BLOCKS, 32, "KV pages gathered and scored per inner step"),
                Knob("buffers", (1, 2), 2, "page buffers: 2 starts the next kv block's page DMAs before computing"),
                Knob("q_splits", (1, 2, 4, 8), 1, "passes per query block: each sequence's rows are scored in "
                     "passes of q_block / q_splits tokens, only the passes that hold them (a decode's row: one)"),
                Knob("kv_load", ("strided", "words"), "strided", "strided: K and V each one strided load of bf16 "
                     "rows; words: pages copied as uint32 words, K and V split from one load by shifts (bf16)"),
            ],
            check,
        )
