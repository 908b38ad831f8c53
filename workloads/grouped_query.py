"""What GQA and sparse attention share: query heads in groups that share one KV head."""

from __future__ import annotations

import jax.numpy as jnp

from .base import (
    attention_knobs,
    indivisible,
    Knob,
    over_vmem,
    pow2_divisors,
    ScheduleSpace,
    tile_bytes,
    validate_attention_config,
    Workload,
)
from .essential import causal_attention_work

CHECK_KV_HEADS = 2


class GroupedQueryAttention(Workload):
    """Causal attention of ``num_query_heads`` over ``num_kv_heads`` (a multiple of them).

    The check keeps the group size and shrinks the KV heads to ``CHECK_KV_HEADS``. The
    schedule space adds ``heads_per_step`` to the attention knobs: query heads of one group
    per step, which share each k/v block. ``heads_in_lanes``: a step's heads sit side by side
    in one (block_q, heads·d) tile of q, o and acc (GQA's BSHD layout), or in one (block_q, d)
    tile each (sparse's BHSD)."""

    heads_in_lanes: bool
    positive_int_keys = ("batch", "seq_len", "num_query_heads", "num_kv_heads", "head_dim")

    def check_config(self):
        out = super().check_config()
        group = self.config["num_query_heads"] // self.config["num_kv_heads"]
        out["num_kv_heads"] = min(CHECK_KV_HEADS, self.config["num_kv_heads"])
        out["num_query_heads"] = out["num_kv_heads"] * group
        return out

    def validate_config(self, config):
        validate_attention_config(self.name, config, self.positive_int_keys)
        if config["num_query_heads"] % config["num_kv_heads"]:
            raise ValueError(f"{self.name}: num_query_heads={config['num_query_heads']} must be a multiple of "
                             f"num_kv_heads={config['num_kv_heads']}")

    def essential_work(self, config):
        return causal_attention_work(self, config, config["batch"], config["num_query_heads"], config["seq_len"],
                                     config["head_dim"])

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        seq, d = config["seq_len"], config["head_dim"]
        group = config["num_query_heads"] // config["num_kv_heads"]
        heads = pow2_divisors(group, 1, 16)
        lanes = self.heads_in_lanes

        def check(s):
            bq, bk, g = s["block_q"], s["block_k"], s["heads_per_step"]
            msg = indivisible({"block_q": ("seq_len", seq), "block_k": ("seq_len", seq),
                               "heads_per_step": ("query heads per KV head", group)}, s)
            if msg:
                return msg

            def heads_tile(dtype):  # q, o or acc for the step's g heads
                return tile_bytes((bq, g * d), dtype) if lanes else g * tile_bytes((bq, d), dtype)

            vmem = (
                2 * heads_tile(dt)  # q, double-buffered
                + 2 * s["buffers"] * tile_bytes((bk, d), dt)  # k and v
                + 2 * heads_tile(dt)  # o, double-buffered
                + 2 * g * tile_bytes((bq, 128), "float32")  # m, l scratch per head
                + heads_tile("float32")  # acc scratch
            )
            # f32 score-sized temporaries (scores, probabilities, the causal mask): 0.25 + 0.6 per
            # head of a (block_q, block_k) tile, fitted to v6e compiles at the full size.
            vmem += (5 + 12 * g) * tile_bytes((bq, bk), "float32") // 20
            return over_vmem(vmem)

        return ScheduleSpace(attention_knobs(after_blocks=Knob(
            "heads_per_step", heads, max(h for h in heads if h <= 4),
            "query heads of one KV group per grid step: each k/v block is fetched once for all of them")), check)
