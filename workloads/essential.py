"""Helpers of the workloads' ``essential_work`` overrides (``base.Workload.essential_work``):
the bytes of the spec's inputs and outputs from their shapes (nothing is built), the causal
(query, key) pair count, and the seed-0 values of small integer inputs (page tables, lengths,
group sizes), built under jit so that XLA drops the large arrays ``make_inputs`` also draws.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np


def aval_bytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize


def io_avals(wl, config: Mapping[str, Any]) -> tuple[list, list]:
    """(input avals, output avals) of ``wl``'s reference at ``config`` (traced, not run)."""
    import jax

    specs = jax.eval_shape(lambda: wl.make_inputs(config, 0))
    out = jax.eval_shape(lambda *a: wl.reference(config, *a), *specs)
    return list(jax.tree_util.tree_leaves(specs)), list(jax.tree_util.tree_leaves(out))


def io_bytes(wl, config: Mapping[str, Any], skip: tuple[int, ...] = ()) -> int:
    """Every input read once (but those at the positions in ``skip``) and every output written once."""
    ins, outs = io_avals(wl, config)
    return sum(aval_bytes(a) for i, a in enumerate(ins) if i not in skip) + sum(aval_bytes(a) for a in outs)


def causal_pairs(q_len: int, kv_len: int | None = None) -> int:
    """(query, key) pairs a causal mask keeps when ``q_len`` queries are the last of ``kv_len``
    positions (default: all of them): query row r sees keys 0 .. kv_len - q_len + r."""
    kv = q_len if kv_len is None else kv_len
    rows = np.arange(q_len, dtype=np.int64)
    return int(np.clip(kv - q_len + rows + 1, 0, kv).sum())


def causal_attention_work(wl, config: Mapping[str, Any], batch: int, heads: int, seq: int,
                          head_dim: int) -> tuple[float, float]:
    """(bytes, flops) of a causal self-attention: every input and output once, and QKᵀ and PV
    only for the S(S+1)/2 (query, key) pairs at or below the diagonal."""
    return float(io_bytes(wl, config)), 2.0 * 2 * batch * heads * head_dim * causal_pairs(seq)


def spec_arrays(wl, config: Mapping[str, Any], pick: Callable) -> Any:
    """``pick(*make_inputs(config, 0))`` as numpy arrays: traced under jit, so the inputs ``pick``
    does not use (the large float arrays) are never drawn."""
    import jax

    out = jax.jit(lambda: pick(*wl.make_inputs(config, 0)))()
    return jax.tree_util.tree_map(np.asarray, out)


def referenced_tokens(page_indices, kv_lens, page_size: int) -> int:
    """Distinct KV cache slots the sequences reference: position t < kv_lens[i] of sequence i
    lives at page page_indices[i, t // page_size], slot t % page_size."""
    slots = [page_indices[i, t // page_size] * page_size + t % page_size
             for i, t in enumerate(np.arange(int(n)) for n in kv_lens)]
    return int(np.unique(np.concatenate(slots or [np.zeros(0, np.int64)])).size)
