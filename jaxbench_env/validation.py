"""The simulator's ranking of Pallas kernels against public TPU timings outside its fitted rows.

Three checks, each a core function here with a thin CLI under ``benchmarks/``:

1. **jax's tuned block sizes of ragged paged attention (TPU v6)** (``run_rpa``,
   ``benchmarks/rpa_tuned_blocks.py``). jax ships, in
   ``jax/experimental/pallas/ops/tpu/ragged_paged_attention/tuned_block_sizes.py``,
   ``TUNED_BLOCK_SIZES['TPU v6']``: for a shape key (q dtype, kv dtype, query heads per
   block, KV heads per block, head_dim, page_size, max_num_batched_tokens, max_model_len)
   the (num_kv_pages_per_block, num_queries_per_block) measured fastest on a real v6e. For
   a deterministic sample of those shapes (``sample_rpa_shapes``) jax's kernel is compiled
   for v6e at every legal pair (``rpa_pairs``) and priced the way the judge prices a
   candidate (``predict_exported``: the exported program's scalar-prefetch tables evaluated
   on concrete values, matched to the compiled kernels, ``sim.predict_program``, the
   physical floor). The headline: in what fraction of shapes the tuned pair is predicted
   within 10% of the best legal pair. The table names the fastest pair and publishes no
   times, so that rank is the only criterion. Also reported: the same on the model's times
   before the floor (which ties pairs), and a diagnostic outside the simulator that prices
   the compiled kernel's loops with the batch's trip counts (``rpa_trip_estimate``).

   The batch is the one the table was tuned on (``rpa_batch``: 34 decodes and one long
   sequence, from the public autotune script): the ranking of query blocks depends on it
   (decode-heavy batches favour small query blocks, long prefills large ones).

2. **The Pallas TPU matmul guide's times (TPU v5e)** (``run_matmul_guide``,
   ``benchmarks/pallas_guides_v5e.py``). JAX's guide (docs/pallas/tpu/matmul) publishes
   times of its simple blocked matmul on a v5e for two block shapes at three sizes, in three
   variants (plain, transposed right-hand side, fused ReLU), and of XLA's matmul; they are
   in ``jaxbench_env/data/pallas_matmul_guide_v5e.csv`` (source and revision in its header).
   The same kernel (``guide_matmul``, our own code after the guide's description) is
   compiled for v5e (``aot.compile_for(..., "v5e")``) and priced with the V5E chip table.
   Reported: Spearman of predicted vs measured and the median absolute relative error.
   The constants (clock, bandwidth efficiency, overlap) are the v6e fit's: nothing is
   refitted for v5e.

3. **The Pallas TPU sparse guide's times (TPU v5e)** (``run_sparse_guide``,
   ``benchmarks/pallas_guides_v5e.py``). JAX's scalar-prefetch guide (docs/pallas/tpu/sparse)
   publishes v5e times of two block-sparse kernels at 16384^3 and of their XLA references: a
   block-sparse left operand (86 of 1024 blocks) times a dense one, its grid walking only
   the nonzero blocks named by prefetched tables; and a dense matmul under a lower-triangular
   mask that skips the output blocks above the diagonal with ``pl.when`` while prefetch maps
   hold the next computed block's tiles (``jaxbench_env/data/pallas_sparse_guide_v5e.csv``).
   The kernels the model must price by the steps and branches that run, on real tables.
   Our code after the guide's description (``sparse_dense_matmul``, ``output_mask_matmul``),
   priced as the matmul guide's rows.

``main`` (``python -m jaxbench_env.validation``) runs all three with small defaults; ``jaxbench
sim-report --pallas-validation`` runs it in a fresh process (the compiles need
``aot.prepare_process`` before libtpu loads).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from workloads.base import tile_bytes

GUIDE_CSV = Path(__file__).parent / "data" / "pallas_matmul_guide_v5e.csv"
WITHIN = 0.10  # the tuned pair counts as found when predicted within 10% of the best pair

# --- shared: price an exported program as the judge does ---------------------------------------


def _log(progress, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def export_tpu(fn: Callable, specs, chip: str = "v6e"):
    """``fn`` exported for TPU at ``specs`` (a ``jax.export.Exported``), lowered with the
    ``chip`` compile target as default device (some Mosaic lowering rules consult it)."""
    import jax

    from jaxbench_env.aot import device

    with jax.default_device(device(chip)):
        return jax.export.export(jax.jit(fn), platforms=["tpu"])(*specs)


def predict_exported(exported, args=None, chip: str = "v6e", essential: tuple | None = None) -> dict:
    """Compile an exported program for ``chip`` and price it with that chip's table, the
    judge's way (``judge._simulate``): the kernels' scalar-prefetch tables are evaluated from
    ``args`` (the program's inputs, or a function returning them, built under jit; None: no
    concrete values) and put in the compiled program's order; with ``essential`` (bytes,
    FLOPs), no time is below the chip's physical floor for that work. Returns time_s (the
    judged time), model_s (the model's, before the floor), floor_s, the breakdown's notes
    and kernels, compile seconds, the compiled program's ``optimal_seconds`` and its
    ``features`` (``ProgramFeatures.to_dict``: a saved sweep can be re-priced without
    compiling again). Raises on a compile failure."""
    from jaxbench_env.aot import compile_for
    from jaxbench_env.sim import V5E, V6E, bundles, mosaic, predict_program
    from jaxbench_env.sim.prefetch import prefetch_tables

    table = {"v6e": V6E, "v5e": V5E}[chip]
    bundles.collect()  # drop what an earlier failed compile may have left
    t0 = time.perf_counter()
    _, compiled = compile_for(exported.call, exported.in_avals, chip)
    profiles = bundles.collect()
    compile_s = time.perf_counter() - t0
    prefetch = None
    if args is not None:
        tables = prefetch_tables(exported, args)
        order = mosaic.match_calls(mosaic.hlo_custom_calls(compiled.as_text()),
                                   mosaic.stablehlo_custom_calls(exported.mlir_module()))
        prefetch = [tables[j] if j is not None else None for j in order]
    breakdown = predict_program(compiled, table, profiles, prefetch)
    loops = {c.name: loop_levels(profiles[c.name]) for c in mosaic.hlo_custom_calls(compiled.as_text())
             if c.pallas and c.name in profiles}
    floor_s = table.floor_s(*essential) if essential is not None else 0.0
    return {"time_s": max(breakdown.time_s, floor_s), "model_s": breakdown.time_s, "floor_s": floor_s,
            "floored": breakdown.time_s < floor_s, "notes": list(breakdown.notes), "compile_s": compile_s,
            "kernels": [{k: v for k, v in kern.items() if k != "grid"} for kern in breakdown.kernels],
            "glue_s": breakdown.glue_s, "optimal_seconds": breakdown.optimal_seconds,
            "calibration": breakdown.constants, "kernel_loops": loops, "features": breakdown.features.to_dict()}


def loop_levels(profile) -> dict:
    """A kernel's bundles by how many loops of data-dependent trip count enclose them (for
    the trip-count diagnostic, not the simulator): ``outside`` the grid loop; ``levels[d]``:
    bundles in one grid iteration at dynamic depth d (static inner loops multiplied by their
    trips, both sides of every branch counted)."""
    addr = np.asarray(profile.addresses)
    outer = profile.outer_loop()
    if outer is None:
        return {"outside": float(len(addr)), "levels": [], "grid_trip": None}
    mult = np.ones(len(addr))
    depth = np.zeros(len(addr), int)
    for lp in profile.loops:
        inside = (addr >= lp.start) & (addr <= lp.end)
        if lp is outer:
            continue
        if lp.trip is None:
            depth[inside] += 1
        else:
            mult[inside] *= lp.trip
    in_grid = (addr >= outer.start) & (addr <= outer.end)
    levels = [float(mult[in_grid & (depth == d)].sum()) for d in range(int(depth.max()) + 1)]
    return {"outside": float(mult[~in_grid].sum()), "levels": levels, "grid_trip": outer.trip}


def simulator_state() -> dict:
    """Which simulator produced a result: its features version, the calibration's version and
    a digest of its source files (the figures belong to that state)."""
    import hashlib

    from jaxbench_env.sim import FEATURES_VERSION, calibration

    digest = hashlib.sha1()
    for path in sorted((Path(__file__).parent / "sim").glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return {"features_version": FEATURES_VERSION, "calibration": calibration().version,
            "sim_sources_sha1": digest.hexdigest()[:12]}


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


# --- 1. ragged paged attention: jax's tuned block sizes --------------------------------------

RPA_KV_PAGES = (4, 8, 16)  # num_kv_pages_per_block values TUNED_BLOCK_SIZES['TPU v6'] uses
RPA_Q_BLOCKS = (32, 64, 128, 256)  # num_queries_per_block values it uses
RPA_VMEM_LIMIT = 96 * 2**20  # vmem_limit_bytes for every candidate (the tuned 16-page blocks of
# 256-token pages need 32 MiB of KV buffers alone, over Mosaic's 32 MiB default)
RPA_TUNING_DECODES = 34  # the tuning example's decodes (``rpa_batch``)
RPA_TUNING_SLOTS = 128  # and its fewest slots (max_num_seqs)
NOTE_UNEVALUATED = "index maps that could not be evaluated"


@dataclass(frozen=True)
class RpaShape:
    """One key of the tuned table (bf16 only) and its tuned (kv pages, queries) per block."""

    num_q_heads: int  # query heads per block: the kernel is run with exactly these heads
    num_kv_heads: int  # KV heads per block
    head_dim: int
    page_size: int
    max_num_batched_tokens: int
    max_model_len: int
    tuned: tuple  # (num_kv_pages_per_block, num_queries_per_block)

    @property
    def pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    @property
    def label(self) -> str:
        return (f"h{self.num_q_heads}/{self.num_kv_heads} d{self.head_dim} p{self.page_size} "
                f"T{self.max_num_batched_tokens} L{self.max_model_len}")


def rpa_tuned_table(device: str = "TPU v6") -> dict:
    """jax's ``TUNED_BLOCK_SIZES[device]``: key -> (num_kv_pages_per_block, num_queries_per_block)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention.tuned_block_sizes import TUNED_BLOCK_SIZES

    return dict(TUNED_BLOCK_SIZES[device])


def rpa_shapes(table: dict | None = None) -> list[RpaShape]:
    """Every bf16 shape of the tuned table whose heads the kernel runs in one head block
    (it does for all of 'TPU v6'), sorted."""
    table = rpa_tuned_table() if table is None else table
    out = []
    for key, tuned in sorted(table.items()):
        q_dtype, kv_dtype, hq, hkv, d, page, tokens, model_len = key
        if q_dtype == kv_dtype == "bfloat16" and hq % hkv == 0:
            out.append(RpaShape(hq, hkv, d, page, tokens, model_len, tuple(tuned)))
    return out


def sample_rpa_shapes(n: int = 20, seed: int = 0, table: dict | None = None) -> list[RpaShape]:
    """``n`` distinct shapes spread over the table, deterministically for a ``seed``: greedily,
    the shape whose head counts, page size, token count and model length have been picked
    least so far (summed over the four), ties broken by a seeded random order. Every head
    pair, page size, token count and model length appears before any repeats where n allows."""
    shapes = rpa_shapes(table)
    order = np.random.default_rng(seed).permutation(len(shapes))
    attrs = (lambda s: (s.num_q_heads, s.num_kv_heads), lambda s: s.page_size,
             lambda s: s.max_num_batched_tokens, lambda s: s.max_model_len)
    counts = [dict() for _ in attrs]
    chosen, free = [], [shapes[i] for i in order]
    while free and len(chosen) < n:
        best = min(free, key=lambda s: sum(c.get(a(s), 0) for c, a in zip(counts, attrs)))
        free.remove(best)
        chosen.append(best)
        for c, a in zip(counts, attrs):
            c[a(best)] = c.get(a(best), 0) + 1
    return chosen


@dataclass(frozen=True)
class RpaBatch:
    """A mixed prefill+decode batch: per active sequence its query and KV lengths."""

    q_lens: tuple
    kv_lens: tuple
    max_num_seqs: int  # slots (the page table's rows); slots past the active ones are empty


def rpa_batch(shape: RpaShape) -> RpaBatch:
    """The batch the tuned table was measured on, which every pair of a shape is priced on.

    The public autotune script behind jax's table (it imports jax's kernel and
    ``tuned_block_sizes`` and times every pair on one example, ``get_qkv_lens_example``) runs
    35 sequences in 128 or more slots: 34 decodes of 1 query token, then one sequence holding
    the rest of min(T, L) tokens (T = max_num_batched_tokens, L = max_model_len), every KV
    length L. Here the slots are 128, the script's smallest."""
    tokens = min(shape.max_num_batched_tokens, shape.max_model_len)
    q_lens = (1,) * RPA_TUNING_DECODES + (tokens - RPA_TUNING_DECODES,)
    return RpaBatch(q_lens, (shape.max_model_len,) * len(q_lens), RPA_TUNING_SLOTS)


def rpa_tables(shape: RpaShape, batch: RpaBatch | None = None, seed: int = 0) -> dict:
    """The kernel's integer inputs as numpy arrays: kv_lens, page_indices (a seeded
    permutation of the cache's pages), cu_q_lens, num_seqs."""
    batch = rpa_batch(shape) if batch is None else batch
    slots, pps = batch.max_num_seqs, shape.pages_per_seq
    active = len(batch.q_lens)
    kv_lens = np.zeros(slots, np.int32)
    kv_lens[:active] = batch.kv_lens
    cu = np.concatenate([[0], np.cumsum(batch.q_lens)])
    cu_q_lens = np.concatenate([cu, np.full(slots - active, cu[-1])]).astype(np.int32)
    pages = np.random.default_rng(seed).permutation(slots * pps).astype(np.int32).reshape(slots, pps)
    return {"kv_lens": kv_lens, "page_indices": pages, "cu_q_lens": cu_q_lens,
            "num_seqs": np.asarray([active], np.int32)}


def rpa_specs(shape: RpaShape, batch: RpaBatch | None = None) -> list:
    """ShapeDtypeStructs of the kernel's six inputs, in its order."""
    import jax
    import jax.numpy as jnp

    batch = rpa_batch(shape) if batch is None else batch
    slots, pps = batch.max_num_seqs, shape.pages_per_seq
    return [jax.ShapeDtypeStruct((shape.max_num_batched_tokens, shape.num_q_heads, shape.head_dim), jnp.bfloat16),
            jax.ShapeDtypeStruct((slots * pps, shape.page_size, 2 * shape.num_kv_heads, shape.head_dim), jnp.bfloat16),
            jax.ShapeDtypeStruct((slots,), jnp.int32), jax.ShapeDtypeStruct((slots, pps), jnp.int32),
            jax.ShapeDtypeStruct((slots + 1,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32)]


def rpa_vmem_bytes(shape: RpaShape, kv_pages: int, q_block: int) -> int:
    """A lower bound on the kernel's VMEM (tile-padded): double-buffered q and output blocks,
    the double KV page buffer, the f32 accumulator and the l and m scratch. Temporaries
    (scores, masks) come on top; the compiler has the last word."""
    hq, hkv, d = shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    ratio = hq // hkv
    return (4 * q_block * tile_bytes((hq, d), "bfloat16")  # q and o blocks, two buffers each
            + 2 * kv_pages * shape.page_size * tile_bytes((2 * hkv, d), "bfloat16")  # KV double buffer
            + q_block * tile_bytes((hq, d), "float32")  # acc (f32)
            + 2 * hkv * tile_bytes((q_block * ratio, 128), "float32"))  # l and m (f32)


def rpa_pairs(shape: RpaShape, max_pairs: int | None = None) -> list[tuple]:
    """The legal (num_kv_pages_per_block, num_queries_per_block) pairs of a shape: the
    table's ranges (``RPA_KV_PAGES`` x ``RPA_Q_BLOCKS``), KV pages at most pages_per_seq
    (jax's own clamp), queries at most max_num_batched_tokens, the VMEM lower bound within
    ``RPA_VMEM_LIMIT``; with the tuned pair always included. ``max_pairs`` keeps the tuned
    pair and its nearest neighbours (log2 distance, then smaller blocks first)."""
    tuned = (min(shape.tuned[0], shape.pages_per_seq), min(shape.tuned[1], shape.max_num_batched_tokens))
    pairs = {(kv, q) for kv in RPA_KV_PAGES for q in RPA_Q_BLOCKS
             if kv <= shape.pages_per_seq and q <= shape.max_num_batched_tokens
             and rpa_vmem_bytes(shape, kv, q) <= RPA_VMEM_LIMIT}
    pairs.add(tuned)
    ordered = sorted(pairs, key=lambda p: (abs(math.log2(p[0] / tuned[0])) + abs(math.log2(p[1] / tuned[1])), p))
    if max_pairs is not None:
        ordered = ordered[:max(1, max_pairs)]
    return sorted(ordered)


def rpa_essential(shape: RpaShape, batch: RpaBatch | None = None) -> tuple[float, float]:
    """(bytes, FLOPs) no kernel can avoid on the batch, as the workload's ``essential_work``
    counts them: the query rows and the output once, every KV token of every sequence once
    (K and V), the tables; QK^T and PV over the causal (query, key) pairs only."""
    from workloads.essential import causal_pairs

    batch = rpa_batch(shape) if batch is None else batch
    hq, hkv, d = shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    tokens = shape.max_num_batched_tokens
    nbytes = (2 * tokens * hq * d * 2 + sum(batch.kv_lens) * 2 * hkv * d * 2
              + 4 * batch.max_num_seqs * (shape.pages_per_seq + 2) + 8)
    pairs = sum(causal_pairs(q, kv) for q, kv in zip(batch.q_lens, batch.kv_lens))
    return float(nbytes), 4.0 * hq * d * pairs


def rpa_loop_trips(shape: RpaShape, kv_pages: int, q_block: int, batch: RpaBatch | None = None) -> dict:
    """How often the kernel's loops run on the batch: grid steps (query blocks), sequence
    visits (each query block walks the sequences whose queries it holds) and KV-block
    iterations (each visit walks its sequence's KV in blocks of kv_pages pages)."""
    batch = rpa_batch(shape) if batch is None else batch
    cu = np.concatenate([[0], np.cumsum(batch.q_lens)])
    span = kv_pages * shape.page_size
    steps = -(-shape.max_num_batched_tokens // q_block)
    visits = kv_iters = 0
    for b in range(steps):
        lo, hi = b * q_block, (b + 1) * q_block
        for s, kv in enumerate(batch.kv_lens):
            if cu[s] < hi and cu[s + 1] > lo:
                visits += 1
                kv_iters += -(-kv // span)
    return {"steps": steps, "visits": visits, "kv_iters": kv_iters}


def rpa_trip_estimate(shape: RpaShape, kv_pages: int, q_block: int, loops: dict, chip=None, cal=None) -> float | None:
    """Diagnostic, not the simulator: the compiled kernel's own bundles priced with the
    batch's trip counts. Bundles outside the data-dependent loops once per grid step, the
    sequence loop's once per visit, the KV loop's once per KV block, each KV block at least
    its page copies' time (they overlap the previous block's compute). Query and output
    blocks are left out. None when the kernel does not have the two expected loop levels."""
    from jaxbench_env.sim import V6E, calibration

    chip, cal = chip or V6E, cal or calibration()
    if len(loops.get("levels", [])) != 3:
        return None
    trips = rpa_loop_trips(shape, kv_pages, q_block)
    per_step, per_visit, per_kv = loops["levels"]
    kv_bytes = kv_pages * shape.page_size * 2 * shape.num_kv_heads * shape.head_dim * 2
    bandwidth = chip.hbm_bytes_per_s * cal.hbm_efficiency
    clock = cal.bundle_rate_hz
    return ((loops["outside"] + trips["steps"] * per_step + trips["visits"] * per_visit) / clock
            + trips["kv_iters"] * max(per_kv / clock, kv_bytes / bandwidth))


def rpa_program(shape: RpaShape, kv_pages: int, q_block: int) -> Callable:
    """jax's ragged paged attention kernel at one pair, as a function of its six inputs."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    def fn(q, kv_pages_arr, kv_lens, page_indices, cu_q_lens, num_seqs):
        return ragged_paged_attention(q, kv_pages_arr, kv_lens, page_indices, cu_q_lens, num_seqs,
                                      sm_scale=shape.head_dim ** -0.5, num_kv_pages_per_block=kv_pages,
                                      num_queries_per_block=q_block, vmem_limit_bytes=RPA_VMEM_LIMIT)

    return fn


def predict_rpa(shape: RpaShape, kv_pages: int, q_block: int, seed: int = 0) -> dict:
    """Predicted v6e time of jax's kernel at one pair on ``rpa_batch(shape)``, with concrete
    prefetch tables. Raises on a compile failure."""
    import jax.numpy as jnp

    specs = rpa_specs(shape)
    tables = rpa_tables(shape, seed=seed)

    def inputs():  # built under jit: the two float arrays are never drawn
        return (jnp.zeros(specs[0].shape, specs[0].dtype), jnp.zeros(specs[1].shape, specs[1].dtype),
                *(jnp.asarray(tables[k]) for k in ("kv_lens", "page_indices", "cu_q_lens", "num_seqs")))

    exported = export_tpu(rpa_program(shape, kv_pages, q_block), specs)
    out = predict_exported(exported, inputs, "v6e", rpa_essential(shape))
    out["unevaluated_index_maps"] = any(NOTE_UNEVALUATED in n for n in out["notes"])
    loops = next(iter(out["kernel_loops"].values()), None)  # the one Pallas kernel's
    out["trip_aware_s"] = rpa_trip_estimate(shape, kv_pages, q_block, loops) if loops else None
    return out


def rank(times: dict, tuned: tuple) -> dict:
    """Where ``tuned`` ranks among ``times`` (pair -> seconds): the best pair, the tuned pair's
    time over the best's, whether that is within ``WITHIN`` (None when the tuned pair has no time)."""
    if tuned not in times:
        return {"best": None, "ratio": None, "within": None}
    best = min(times, key=lambda p: (times[p], p))
    ratio = times[tuned] / times[best]
    return {"best": best, "ratio": ratio, "within": ratio <= 1.0 + WITHIN}


@dataclass
class RpaResult:
    shape: RpaShape
    times: dict = field(default_factory=dict)  # (kv, q) -> judged seconds (the model's, raised to the floor)
    model: dict = field(default_factory=dict)  # (kv, q) -> the model's seconds, before the floor
    trips: dict = field(default_factory=dict)  # (kv, q) -> diagnostic: the kernel's loops priced with trip counts
    failed: dict = field(default_factory=dict)  # (kv, q) -> error
    notes: list = field(default_factory=list)

    @property
    def tuned(self) -> tuple:
        s = self.shape
        return (min(s.tuned[0], s.pages_per_seq), min(s.tuned[1], s.max_num_batched_tokens))

    @property
    def judged(self) -> dict:
        return rank(self.times, self.tuned)

    @property
    def best(self) -> tuple | None:
        return self.judged["best"]

    @property
    def ratio(self) -> float | None:
        """Judged time of the tuned pair over the best pair's (1: the tuned pair is best)."""
        return self.judged["ratio"]

    @property
    def within(self) -> bool | None:
        return self.judged["within"]

    @property
    def floored(self) -> list:
        return sorted(p for p in self.times if self.model[p] < self.times[p])

    def to_dict(self) -> dict:
        def keyed(d):
            return {f"{kv}x{q}": t for (kv, q), t in sorted(d.items())}

        def ranked(d):
            r = rank(d, self.tuned)
            return {**r, "best": list(r["best"]) if r["best"] else None}

        return {"shape": asdict(self.shape), "label": self.shape.label, "tuned": list(self.tuned),
                "best": list(self.best) if self.best else None, "ratio": self.ratio, "within_10pct": self.within,
                "tuned_floored": self.tuned in self.floored, "model_rank": ranked(self.model),
                "trip_rank": ranked(self.trips) if self.trips else None,
                "times_s": keyed(self.times), "model_s": keyed(self.model), "trip_aware_s": keyed(self.trips),
                "floored": [f"{kv}x{q}" for kv, q in self.floored],
                "failed": keyed(self.failed), "notes": self.notes}

    @classmethod
    def from_dict(cls, d: dict) -> "RpaResult":
        def unkeyed(m):
            return {tuple(int(x) for x in k.split("x")): v for k, v in (m or {}).items()}

        sh = {**d["shape"], "tuned": tuple(d["shape"]["tuned"])}
        return cls(RpaShape(**sh), unkeyed(d["times_s"]), unkeyed(d["model_s"]), unkeyed(d.get("trip_aware_s")),
                   unkeyed(d["failed"]), list(d["notes"]))


def run_rpa(n_shapes: int = 20, seed: int = 0, max_pairs: int | None = None, progress: bool = True,
            shapes: list[RpaShape] | None = None, budget_s: float | None = None,
            on_shape: Callable[[dict], None] | None = None, pair_cache: dict | None = None) -> dict:
    """Sweep the legal pairs of ``n_shapes`` sampled shapes; returns per-shape results and the
    headline. Priced pairs are kept in ``pair_cache`` ("label|kv|q" -> result; pass a saved one
    to resume a sweep made by the same simulator and batch). ``budget_s``: no compile
    starts once that many seconds have passed; a shape whose sweep is cut short is not
    scored (it would rank the tuned pair among fewer pairs) and is listed with the shapes not
    run.
    ``on_shape``: called with the summary so far after every shape (to save it)."""
    from jaxbench_env.judge import compile_error

    shapes = sample_rpa_shapes(n_shapes, seed) if shapes is None else shapes
    cache = {} if pair_cache is None else pair_cache
    results, t_start, n_compiles = [], time.perf_counter(), 0
    not_run: list = []

    def summary():
        return rpa_summary(results, seed=seed, max_pairs=max_pairs, wall_s=time.perf_counter() - t_start,
                           compiles=n_compiles, requested_shapes=len(shapes), not_run=not_run)

    def spent():
        return budget_s is not None and time.perf_counter() - t_start > budget_s

    for i, shape in enumerate(shapes):
        if spent():
            break
        res = RpaResult(shape)
        pairs = rpa_pairs(shape, max_pairs)
        _log(progress, f"# [{i + 1}/{len(shapes)}] {shape.label}: tuned {res.tuned}, {len(pairs)} pairs")
        for kv, q in pairs:
            if spent():
                break
            key = f"{shape.label}|{kv}|{q}"
            if key not in cache:
                t0 = time.perf_counter()
                try:
                    cache[key] = predict_rpa(shape, kv, q, seed)
                except Exception as e:  # noqa: BLE001 - a candidate that fails to compile is skipped
                    cache[key] = {"error": compile_error(e)}
                n_compiles += 1
                got = cache[key]
                _log(progress, f"#   {kv:>2} pages x {q:>3} queries: "
                     + (f"{got['time_s'] * 1e3:.4f} ms" if "time_s" in got else f"FAILED {got['error'][:100]}")
                     + f"  ({time.perf_counter() - t0:.1f} s)")
            got = cache[key]
            if "time_s" in got:
                res.times[(kv, q)] = got["time_s"]
                res.model[(kv, q)] = got["model_s"]
                if got.get("trip_aware_s") is not None:
                    res.trips[(kv, q)] = got["trip_aware_s"]
                for note in got["notes"]:
                    if note not in res.notes:
                        res.notes.append(note)
            else:
                res.failed[(kv, q)] = got["error"]
        if spent():  # this shape's sweep is incomplete: not scored
            break
        results.append(res)
        if on_shape is not None:
            on_shape(summary())
    if len(results) < len(shapes):
        not_run = [s.label for s in shapes[len(results):]]
        _log(progress, f"# time budget of {budget_s:.0f} s spent: {len(not_run)} shapes not run (or not finished)")
    return summary()


def reprice_rpa(saved: dict) -> dict:
    """Score a saved sweep (``benchmarks/rpa_tuned_blocks.py --json``) again with today's
    ``price`` and constants, from the program features each pair saved: no compile, seconds
    for a whole sweep. The features must come from this features version (what they hold and
    how ``price`` reads them change together); the trip-count diagnostic is kept as saved."""
    from jaxbench_env.sim import FEATURES_VERSION, V6E
    from jaxbench_env.sim.model import ProgramFeatures, price

    version = saved.get("simulator", {}).get("features_version")
    if version != FEATURES_VERSION:
        raise ValueError(f"the sweep's features are of version {version}, the simulator's of {FEATURES_VERSION}: "
                         "run the sweep again")
    pairs = {}
    for key, got in saved["pairs"].items():
        if "features" in got:
            model_s = price(ProgramFeatures.from_dict(got["features"]), V6E).time_s
            got = {**got, "model_s": model_s, "time_s": max(model_s, got["floor_s"])}
        pairs[key] = got
    max_pairs = saved.get("max_pairs")
    shapes = [RpaResult.from_dict(d).shape for d in saved["shapes"]]
    missing = [s.label for s in shapes if any(f"{s.label}|{kv}|{q}" not in pairs for kv, q in rpa_pairs(s, max_pairs))]
    if missing:  # run_rpa would compile them
        raise ValueError(f"the sweep has not priced every pair of {missing}")
    return run_rpa(seed=saved["seed"], max_pairs=max_pairs, progress=False, shapes=shapes, pair_cache=pairs)


def rpa_summary(results: list[RpaResult], **extra) -> dict:
    """Headline figures: the judged criterion (the judge's times, floor included), the same on
    the model's times before the floor, and the trip-count diagnostic where computed."""
    def tally(ranks):
        scored = [r for r in ranks if r["within"] is not None]
        hits = sum(bool(r["within"]) for r in scored)
        ratios = [r["ratio"] for r in scored]
        return {"scored": len(scored), "within_10pct": hits,
                "fraction_within_10pct": hits / len(scored) if scored else None,
                "median_ratio": float(np.median(ratios)) if ratios else None}

    judged = tally([r.judged for r in results])
    return {"shapes": [r.to_dict() for r in results], **judged,
            "tuned_is_best": sum(r.best == r.tuned for r in results if r.within is not None),
            "within_by_floor_tie": sum(bool(r.within) and r.tuned in r.floored for r in results),
            "model": tally([rank(r.model, r.tuned) for r in results]),
            "trip_aware": tally([rank(r.trips, r.tuned) for r in results if r.trips]),
            "failed_pairs": sum(len(r.failed) for r in results),
            "floored_pairs": sum(len(r.floored) for r in results),
            "unevaluated_index_maps": sum(any(NOTE_UNEVALUATED in n for n in r.notes) for r in results),
            "unscored": [r.shape.label for r in results if r.within is None], "simulator": simulator_state(),
            **extra}


def _pair(p) -> str:
    return "-" if not p else f"{p[0]}x{p[1]}"


def _ratio(r) -> str:
    if r is None or r["ratio"] is None:
        return "-"
    return f"{r['ratio']:.2f} ({_pair(r['best'])})"


def rpa_markdown(summary: dict) -> str:
    """Per shape: the judged times (floor included; "f": raised to the physical floor), then
    the tuned/best ratio (and best pair) on the model's own times and on the trip-count
    diagnostic where computed."""
    trips = any(s["trip_rank"] for s in summary["shapes"])
    head = ("| shape (heads q/kv, head_dim, page, tokens, model len) | pairs | tuned (kv x q) | tuned ms | "
            "sim best (kv x q) | best ms | ratio | within 10% | model alone: ratio (best) |")
    rule = "|---|---|---|---|---|---|---|---|---|"
    if trips:
        head += " trip-count diagnostic: ratio (best) |"
        rule += "---|"
    lines = [head, rule]
    for s in summary["shapes"]:
        tuned, best = s["tuned"], s["best"]
        tkey = _pair(tuned)
        t_ms = s["times_s"].get(tkey)
        b_ms = s["times_s"].get(_pair(best)) if best else None
        fails = f" ({len(s['failed'])} failed)" if s["failed"] else ""
        t_txt = "-" if t_ms is None else f"{t_ms * 1e3:.4f}" + (" f" if tkey in s["floored"] else "")
        b_txt = "-" if b_ms is None else f"{b_ms * 1e3:.4f}" + (" f" if _pair(best) in s["floored"] else "")
        ratio = "-" if s["ratio"] is None else f"{s['ratio']:.3f}"
        within = "-" if s["within_10pct"] is None else ("yes" if s["within_10pct"] else "no")
        row = (f"| {s['label']} | {len(s['times_s'])}{fails} | {tkey} | {t_txt} | {_pair(best)} | {b_txt} | "
               f"{ratio} | {within} | {_ratio(s['model_rank'])} |")
        if trips:
            row += f" {_ratio(s['trip_rank'])} |"
        lines.append(row)
    return "\n".join(lines)


def rpa_headline(summary: dict) -> str:
    if not summary["scored"]:
        return "RPA tuned blocks: no shape scored"
    frac = summary["fraction_within_10pct"]
    text = (f"RPA tuned blocks (TPU v6): the tuned pair is predicted (judged, floor included) within 10% of the best "
            f"legal pair in {summary['within_10pct']}/{summary['scored']} shapes ({frac:.0%}; target >= 80% of >= 20 "
            f"shapes), {summary['within_by_floor_tie']} of them only because the tuned pair ties at the physical "
            "floor; "
            f"predicted best in {summary['tuned_is_best']}; median tuned/best {summary['median_ratio']:.3f}")
    m = summary["model"]
    if m["scored"]:
        text += (f". The model alone (before the floor): {m['within_10pct']}/{m['scored']} "
                 f"({m['fraction_within_10pct']:.0%}), median tuned/best {m['median_ratio']:.3f}")
    t = summary["trip_aware"]
    if t["scored"]:
        text += (f". Trip-count diagnostic (not the simulator): {t['within_10pct']}/{t['scored']} "
                 f"({t['fraction_within_10pct']:.0%}), median tuned/best {t['median_ratio']:.3f}")
    text += (f". {summary['failed_pairs']} pairs failed to compile, {summary['floored_pairs']} were raised "
             "to the physical floor")
    if summary.get("not_run"):
        text += f"; {len(summary['not_run'])} of {summary['requested_shapes']} shapes not run (time budget)"
    return text


# --- 2. the Pallas TPU matmul guide (TPU v5e) -------------------------------------------------

GUIDE_VARIANTS = ("plain", "transpose_rhs", "relu", "xla")


def read_timings_csv(path: Path, ints: tuple, floats: tuple) -> list[dict]:
    """A published-timings table's rows (comment lines starting with '#' skipped): the
    ``ints`` columns as int (None where empty), the ``floats`` as float."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = []
    for r in rows:
        row = {**r}
        for key in ints:
            row[key] = int(r[key]) if r[key] else None
        for key in floats:
            row[key] = float(r[key])
        out.append(row)
    return out


def load_matmul_guide(path: Path = GUIDE_CSV) -> list[dict]:
    """The guide's rows, numbers parsed."""
    return read_timings_csv(path, ("m", "k", "n", "bm", "bk", "bn"),
                            ("measured_s", "measured_flops_per_s", "utilization_pct"))


def guide_matmul(variant: str, bm: int | None, bk: int | None, bn: int | None) -> Callable:
    """The guide's kernel, our code: a (m/bm, n/bn, k/bk) grid, k innermost, a float32
    accumulator in VMEM zeroed at the first k step and written out (cast, after the
    activation) at the last. ``transpose_rhs``: the right operand is given as (n, k) and
    contracted on its second dimension; ``relu``: ReLU before the cast; ``xla``: jnp.matmul."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if variant == "xla":
        return jnp.matmul
    if variant not in GUIDE_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    transposed = variant == "transpose_rhs"
    dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))

    def kernel(x_ref, y_ref, o_ref, acc_ref, *, k_steps):
        step = pl.program_id(2)

        @pl.when(step == 0)
        def _init():
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims, preferred_element_type=jnp.float32)

        @pl.when(step == k_steps - 1)
        def _store():
            acc = acc_ref[...]
            if variant == "relu":
                acc = jnp.maximum(acc, 0.0)
            o_ref[...] = acc.astype(o_ref.dtype)

    def fn(x, y):
        m, k = x.shape
        n = y.shape[0] if transposed else y.shape[1]
        y_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if transposed
                  else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
        return pl.pallas_call(
            functools.partial(kernel, k_steps=k // bk),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0, grid=(m // bm, n // bn, k // bk),
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), y_spec],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, y)

    return fn


def guide_specs(row: dict) -> list:
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(row["dtype"])
    y = (row["n"], row["k"]) if row["variant"] == "transpose_rhs" else (row["k"], row["n"])
    return [jax.ShapeDtypeStruct((row["m"], row["k"]), dt), jax.ShapeDtypeStruct(y, dt)]


def matmul_essential(row: dict) -> tuple[float, float]:
    """(bytes, FLOPs) of the row's matmul: each operand read once, the output written once; 2mkn."""
    import jax.numpy as jnp

    m, k, n = row["m"], row["k"], row["n"]
    return float((m * k + k * n + m * n) * jnp.dtype(row["dtype"]).itemsize), 2.0 * m * k * n


def v5e_available() -> str | None:
    """None when a v5e compile target can be made here, else why not."""
    try:
        from jaxbench_env.aot import device

        device("v5e")
        return None
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def compile_chip(chip: str, progress: bool) -> str:
    """``chip``, or "v6e" where no v5e compile target can be made here (then only the
    predictions' ranks mean anything against v5e times)."""
    why = v5e_available() if chip == "v5e" else None
    if why is None:
        return chip
    _log(progress, f"# no v5e compile target ({why}): compiling for v6e, rank correlation only")
    return "v6e"


def run_matmul_guide(chip: str = "v5e", progress: bool = True, rows: list[dict] | None = None) -> dict:
    """Compile the guide's kernel for each row and predict its time on ``chip`` ("v5e"; or
    "v6e" when no v5e target can be made, and then only the ranks mean anything)."""
    rows = load_matmul_guide() if rows is None else rows
    chip = compile_chip(chip, progress)
    out, t_start = [], time.perf_counter()
    for i, row in enumerate(rows):
        label = f"{row['variant']} {row['m']}^3 blocks {row['bm']}/{row['bk']}/{row['bn']}"
        out.append(price_timed_row(row, lambda: (guide_matmul(row["variant"], row["bm"], row["bk"], row["bn"]),
                                                 guide_specs(row), None, matmul_essential(row)),
                                   chip, progress, f"# [{i + 1}/{len(rows)}] {label}"))
    return matmul_summary(out, chip, wall_s=time.perf_counter() - t_start)


def price_timed_row(row: dict, build: Callable, chip: str, progress: bool, label: str) -> dict:
    """One published row priced: ``build()`` gives (function, input specs, inputs for the
    scalar-prefetch tables or None, essential (bytes, FLOPs)); the program is exported and
    priced for ``chip`` as the judge prices (``predict_exported``). The row with the
    prediction, its ratio to the measured time, the kernel's steps and the notes; a build
    or compile failure is the row with its error."""
    t0 = time.perf_counter()
    try:
        fn, specs, inputs, essential = build()
        got = predict_exported(export_tpu(fn, specs, chip), inputs, chip, essential)
    except Exception as e:  # noqa: BLE001
        got = {"error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
    _log(progress, f"{label}: " + (f"{got['time_s'] * 1e3:.4f} ms" if "time_s" in got else f"FAILED {got['error']}")
         + f" (measured {row['measured_s'] * 1e3:.4f} ms, {time.perf_counter() - t0:.1f} s)")
    kern = got.get("kernels") or [{}]
    return {**row, "predicted_s": got.get("time_s"), "model_s": got.get("model_s"), "floored": got.get("floored"),
            "error": got.get("error"), "ratio": got["time_s"] / row["measured_s"] if "time_s" in got else None,
            "steps": kern[0].get("steps"), "compute_from": kern[0].get("compute_from"),
            "notes": got.get("notes", [])}


def _scores(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["predicted_s"] is not None]
    if len(ok) < 2:
        return {"rows": len(ok), "spearman": None, "median_abs_rel_error": None}
    rel = [abs(r["predicted_s"] / r["measured_s"] - 1.0) for r in ok]
    return {"rows": len(ok), "spearman": spearman([r["measured_s"] for r in ok], [r["predicted_s"] for r in ok]),
            "median_abs_rel_error": float(np.median(rel)), "max_abs_rel_error": float(np.max(rel))}


def matmul_summary(rows: list[dict], chip: str, **extra) -> dict:
    pallas = [r for r in rows if r["variant"] != "xla"]
    # At 1024^3 the guide's timeit (Python dispatch included) is host-bound: XLA's own matmul
    # there measures 0.12 ms, 9% of peak. The larger sizes are scored apart as well.
    large = [r for r in pallas if r["m"] * r["k"] * r["n"] > 1024**3]
    return {"chip": chip, "rows": rows, "pallas": _scores(pallas), "pallas_large": _scores(large),
            "xla": _scores([r for r in rows if r["variant"] == "xla"]),
            "all": _scores(rows), "failed": sum(r["predicted_s"] is None for r in rows),
            "simulator": simulator_state(), **extra}


def priced_rows_markdown(summary: dict, label: str, extra: tuple = (), digits: int = 4) -> str:
    """A guide's priced rows as a Markdown table: the ``label`` column, size, blocks, the
    ``extra`` (heading, key) columns, grid steps, measured and predicted ms (with the model's
    own time where the floor set it) and their ratio."""
    heads = [label, "m=k=n", "bm/bk/bn", *(h for h, _ in extra), "grid steps", "measured ms (v5e)",
             f"predicted ms ({summary['chip']})", "pred/meas"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in summary["rows"]:
        blocks = "-" if r["bm"] is None else f"{r['bm']}/{r['bk']}/{r['bn']}"
        pred = "FAILED" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e3:.{digits}f}"
        if r.get("floored"):
            pred += f" (floor; model {r['model_s'] * 1e3:.{digits}f})"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        cells = [r[label], r["m"], blocks, *(r[key] or "-" for _, key in extra), r["steps"] if r["bm"] else "-",
                 f"{r['measured_s'] * 1e3:.{digits}f}", pred, ratio]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def matmul_markdown(summary: dict) -> str:
    return priced_rows_markdown(summary, "variant")


def matmul_headline(summary: dict) -> str:
    p = summary["pallas"]
    if p["spearman"] is None:
        return "matmul guide: too few rows predicted"
    chip = summary["chip"]
    text = (f"matmul guide (TPU v5e measured, predicted for {chip}): Pallas rows {p['rows']}, Spearman "
            f"{p['spearman']:.3f} (target >= 0.9)")
    if chip == "v5e":
        text += (f", median |relative error| {p['median_abs_rel_error']:.1%} (target <= 20%), "
                 f"worst {p['max_abs_rel_error']:.0%}")
    else:
        text += " (compiled for v6e: errors against v5e times are not meaningful)"
    big = summary["pallas_large"]
    if big["spearman"] is not None:
        text += (f"; without the host-bound 1024^3 rows ({big['rows']} rows): Spearman {big['spearman']:.3f}"
                 + (f", median |relative error| {big['median_abs_rel_error']:.1%}" if chip == "v5e" else ""))
    x = summary["xla"]
    if x["rows"] and chip == "v5e" and x["median_abs_rel_error"] is not None:
        text += f"; XLA rows {x['rows']}: median |relative error| {x['median_abs_rel_error']:.1%}"
    return text


# --- 3. the Pallas TPU sparse guide (TPU v5e) ---------------------------------------------------

SPARSE_GUIDE_CSV = Path(__file__).parent / "data" / "pallas_sparse_guide_v5e.csv"


def load_sparse_guide(path: Path = SPARSE_GUIDE_CSV) -> list[dict]:
    """The sparse guide's rows, numbers parsed."""
    return read_timings_csv(path, ("m", "k", "n", "bm", "bk", "bn", "computed_blocks"), ("measured_s",))


def guide_lhs_blocks(grid: tuple, p: float = 0.1, seed: int = 0) -> np.ndarray:
    """The sparse_dense row's nonzero left-operand blocks: a Bernoulli(p) draw from the first
    key of ``split(key(seed))``, under the non-partitionable threefry that was jax's default
    when the guide ran (its random bits differ from today's default)."""
    import jax

    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        mask_key, _ = jax.random.split(jax.random.key(seed))
        return np.asarray(jax.random.bernoulli(mask_key, p=p, shape=grid))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def next_computed(live: np.ndarray, kinds: np.ndarray) -> tuple:
    """For each output block, the first computed block at or after it in row-major order:
    its mask kind, row and column (past the last computed block: kind 0 and the last block).
    A skipped grid step fetches that block, so the pipeline holds it when its steps come."""
    rows, cols = live.shape
    kind, row, col = (np.zeros(live.shape, np.int32) for _ in range(3))
    nxt = (0, rows - 1, cols - 1)
    for i in range(rows - 1, -1, -1):
        for j in range(cols - 1, -1, -1):
            if live[i, j]:
                nxt = (int(kinds[i, j]), i, j)
            kind[i, j], row[i, j], col[i, j] = nxt
    return kind, row, col


def sparse_dense_matmul(n: int, block: int, num_blocks: int) -> Callable:
    """The guide's first kernel, our code: out = X @ Y with X given as its nonzero (block,
    block) tiles, ordered by row, and two scalar-prefetch tables (each tile's block row and
    column). Grid (n / block output columns, tiles); a float32 accumulator zeroed at a row's
    first tile and written out at its last; the output aliases a zeros input, so rows
    without tiles stay zero."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(tile_row, tile_col, x_ref, y_ref, zeros_ref, o_ref, acc_ref):
        del tile_col, zeros_ref
        t = pl.program_id(1)
        row = tile_row[t]

        @pl.when((t == 0) | (row != tile_row[jnp.maximum(t - 1, 0)]))
        def _first_tile_of_row():
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        acc_ref[...] += jnp.dot(x_ref[0], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when((t == num_blocks - 1) | (row != tile_row[jnp.minimum(t + 1, num_blocks - 1)]))
        def _last_tile_of_row():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def fn(tile_row, tile_col, x_tiles, y, zeros):
        out_map = lambda j, t, r, c: (r[t], j)  # noqa: E731
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(zeros.shape, zeros.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(n // block, num_blocks),
                in_specs=[pl.BlockSpec((1, block, block), lambda j, t, r, c: (t, 0, 0)),
                          pl.BlockSpec((block, block), lambda j, t, r, c: (c[t], j)),
                          pl.BlockSpec((block, block), out_map)],
                out_specs=pl.BlockSpec((block, block), out_map),
                scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)]),
            input_output_aliases={4: 0},
        )(tile_row, tile_col, x_tiles, y, zeros)

    return fn


def output_mask_matmul(k: int, bm: int, bk: int, bn: int) -> Callable:
    """The guide's second kernel, our code: out = mask * (X @ Y) for a block-sparse mask
    given as four scalar-prefetch tables (whether each output block is computed, and
    ``next_computed``'s kind, row and column) and the distinct mask tiles. Grid (m / bm,
    n / bn, k / bk); each output block is zeroed at its first k step; a computed one
    accumulates in float32 and is masked at its last; a skipped one fetches the next
    computed block's tiles at k step 0 throughout, so it moves nothing new."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    k_steps = k // bk

    def kernel(computed, kind, nrow, ncol, x_ref, y_ref, mask_ref, o_ref, acc_ref):
        del kind, nrow, ncol
        i, j, kk = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        @pl.when(kk == 0)
        def _zero():
            o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        @pl.when(computed[i, j] != 0)
        def _compute():
            acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

            @pl.when(kk == k_steps - 1)
            def _store():
                o_ref[...] = (mask_ref[0] * acc_ref[...]).astype(o_ref.dtype)

    def k_fetched(c, i, j, kk):
        return kk * (c[i, j] != 0).astype(jnp.int32)

    def fn(computed, kind, nrow, ncol, x, y, mask_tiles):
        m, n = x.shape[0], y.shape[1]
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4, grid=(m // bm, n // bn, k_steps),
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk, c, t, r, q: (r[i, j], k_fetched(c, i, j, kk))),
                          pl.BlockSpec((bk, bn), lambda i, j, kk, c, t, r, q: (k_fetched(c, i, j, kk), q[i, j])),
                          pl.BlockSpec((1, bm, bn), lambda i, j, kk, c, t, r, q: (t[i, j], 0, 0))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk, *_: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
        )(computed, kind, nrow, ncol, x, y, mask_tiles)

    return fn


def lower_triangle_blocks(m: int, n: int, bm: int, bn: int) -> tuple:
    """A lower-triangular mask's blocks: which are computed (any one on or below the
    diagonal), each one's kind (0 all ones, 1 the diagonal's triangle) and the two tiles."""
    if bm != bn:
        raise ValueError("the lower-triangular mask's diagonal tiles need square blocks")
    i, j = np.meshgrid(np.arange(m // bm), np.arange(n // bn), indexing="ij")
    tiles = np.stack([np.ones((bm, bn), np.int32), np.tril(np.ones((bm, bn), np.int32))])
    return i >= j, (i == j).astype(np.int32), tiles


def sparse_guide_case(row: dict, live: np.ndarray | None = None) -> tuple:
    """(function, input specs, the inputs (built under jit), essential (bytes, FLOPs)) of
    one row. ``live``: sparse_dense's nonzero blocks (default: the guide's draw)."""
    import jax
    import jax.numpy as jnp

    m, k, n, dt = row["m"], row["k"], row["n"], jnp.dtype(row["dtype"])
    size = dt.itemsize
    spec = jax.ShapeDtypeStruct
    tril_pairs = sum(min(r + 1, n) for r in range(m))  # (row, column) pairs on or below the diagonal
    masked_essential = (float((m * k + k * n + m * n) * size), 2.0 * k * tril_pairs)
    if row["kernel"] == "xla_matmul":
        return jnp.matmul, [spec((m, k), dt), spec((k, n), dt)], None, matmul_essential(row)
    if row["kernel"] == "xla_output_mask":
        return (lambda mask, x, y: mask * (x @ y), [spec((m, n), jnp.int32), spec((m, k), dt), spec((k, n), dt)],
                None, masked_essential)
    bm, bk, bn = row["bm"], row["bk"], row["bn"]
    if row["kernel"] == "sparse_dense":
        if bm != bk or bk != bn:
            raise ValueError("sparse_dense takes square blocks")
        live = guide_lhs_blocks((m // bm, k // bk)) if live is None else live
        tile_row, tile_col = (a.astype(np.int32) for a in np.nonzero(live))
        tiles = len(tile_row)
        specs = [spec((tiles,), jnp.int32)] * 2 + [spec((tiles, bm, bk), dt), spec((k, n), dt), spec((m, n), dt)]

        def inputs():
            return (jnp.asarray(tile_row), jnp.asarray(tile_col), jnp.zeros((tiles, bm, bk), dt),
                    jnp.zeros((k, n), dt), jnp.zeros((m, n), dt))

        nbytes = (tiles * bm * bk + len(set(tile_col)) * bk * n + len(set(tile_row)) * bm * n) * size
        return sparse_dense_matmul(n, bm, tiles), specs, inputs, (float(nbytes), 2.0 * tiles * bm * bk * n)
    if row["kernel"] == "output_mask":
        computed, kinds, tiles = lower_triangle_blocks(m, n, bm, bn)
        tables = (computed.astype(np.int32), *next_computed(computed, kinds))
        specs = ([spec(computed.shape, jnp.int32)] * 4 + [spec((m, k), dt), spec((k, n), dt)]
                 + [spec(tiles.shape, jnp.int32)])

        def inputs():
            return (*map(jnp.asarray, tables), jnp.zeros((m, k), dt), jnp.zeros((k, n), dt), jnp.asarray(tiles))

        return output_mask_matmul(k, bm, bk, bn), specs, inputs, masked_essential
    raise ValueError(f"unknown kernel {row['kernel']!r}")


def run_sparse_guide(chip: str = "v5e", progress: bool = True, rows: list[dict] | None = None) -> dict:
    """Compile each row's program for ``chip`` (as ``run_matmul_guide``) and price it, its
    scalar-prefetch tables evaluated on the row's block pattern."""
    rows = load_sparse_guide() if rows is None else rows
    chip = compile_chip(chip, progress)
    t0 = time.perf_counter()
    out = [price_timed_row(row, lambda: sparse_guide_case(row), chip, progress,
                           f"# [{i + 1}/{len(rows)}] {row['kernel']} {row['m']}^3")
           for i, row in enumerate(rows)]
    pallas = [r for r in out if not r["kernel"].startswith("xla")]
    return {"chip": chip, "rows": out, "pallas": _scores(pallas),
            "xla": _scores([r for r in out if r["kernel"].startswith("xla")]), "all": _scores(out),
            "failed": sum(r["predicted_s"] is None for r in out), "simulator": simulator_state(),
            "wall_s": time.perf_counter() - t0}


def sparse_markdown(summary: dict) -> str:
    return priced_rows_markdown(summary, "kernel", (("blocks computed", "computed_blocks"),), digits=3)


def sparse_headline(summary: dict) -> str:
    ok = [r for r in summary["rows"] if r["ratio"] is not None]
    if summary["chip"] != "v5e":
        return "sparse guide: compiled for v6e, errors against v5e times are not meaningful"
    each = ", ".join(f"{r['kernel']} {r['ratio']:.2f}x" for r in ok)
    text = f"sparse guide (TPU v5e measured, predicted for v5e): predicted/measured {each}"
    p = summary["pallas"]
    if p["median_abs_rel_error"] is not None:
        text += f"; Pallas rows' median |relative error| {p['median_abs_rel_error']:.1%}"
    return text + (f"; {summary['failed']} rows failed" if summary["failed"] else "")


# --- all three, small: ``jaxbench sim-report --pallas-validation`` ------------------------------------

def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="The simulator against public Pallas timings (small defaults).")
    parser.add_argument("--rpa-shapes", type=int, default=6, help="tuned RPA shapes to sweep (default 6)")
    parser.add_argument("--rpa-max-pairs", type=int, default=None, help="pairs per RPA shape at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="both results as one JSON document on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    from jaxbench_env.aot import prepare_process

    prepare_process("sim")
    mm = run_matmul_guide("v5e", progress=not args.quiet)
    if not args.json:
        print("\nPallas TPU matmul guide (jax docs, measured on a TPU v5e) against the simulator:\n")
        print(matmul_markdown(mm))
        print("\n" + matmul_headline(mm), flush=True)
    sp = run_sparse_guide("v5e", progress=not args.quiet)
    if not args.json:
        print("\nPallas TPU sparse guide (jax docs, measured on a TPU v5e) against the simulator:\n")
        print(sparse_markdown(sp))
        print("\n" + sparse_headline(sp), flush=True)
    rpa = run_rpa(args.rpa_shapes, args.seed, args.rpa_max_pairs, progress=not args.quiet)
    if args.json:
        print(json.dumps({"matmul_guide": {**mm, "headline": matmul_headline(mm)},
                          "sparse_guide": {**sp, "headline": sparse_headline(sp)},
                          "rpa_tuned_blocks": {**rpa, "headline": rpa_headline(rpa)}}, indent=1))
        return 0
    print(f"\njax's tuned ragged paged attention blocks (TUNED_BLOCK_SIZES['TPU v6']), {args.rpa_shapes} shapes "
          f"(seed {args.seed}), predicted for v6e:\n")
    print(rpa_markdown(rpa))
    print("\n" + rpa_headline(rpa))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
