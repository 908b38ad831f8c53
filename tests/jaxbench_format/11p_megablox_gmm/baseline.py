"""11p megablox_gmm: mirrors JAXBench's formulation of 11p (Qwen3-235B-A22B MoE grouped matmul).

Each expert's contiguous run of rows is multiplied by that expert's weights. To keep shapes
static, a ``lax.scan`` over experts takes a fixed window of ``max_expert_size`` rows from
the expert's first row, multiplies it (f32 accumulation), zeroes the rows past the expert's
size, and adds the window into an output padded by one window; the padding is cut at the end.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "megablox_gmm_qwen3_235b",
    "model": "Qwen3-235B-A22B",
    "operator": "grouped_matmul",
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "emb_dim": 4096,
    "moe_mlp_dim": 1536,
    "seq_len": 4096,
}


def create_inputs(dtype=jnp.bfloat16):
    experts, depth, width = CONFIG["num_experts"], CONFIG["emb_dim"], CONFIG["moe_mlp_dim"]
    rows = CONFIG["seq_len"] * CONFIG["num_experts_per_tok"]
    key_lhs, key_rhs = jax.random.split(jax.random.key(42), 2)
    bound = 1 / (rows * depth)
    lhs = jax.random.uniform(key_lhs, (rows, depth), dtype=dtype, minval=-bound, maxval=bound)
    lhs = lhs.astype(jnp.bfloat16).astype(dtype)
    rhs = jax.random.uniform(key_rhs, (experts, depth, width), dtype=dtype, minval=-bound, maxval=bound)
    rhs = rhs.astype(jnp.bfloat16).astype(dtype)
    per_expert = rows // experts
    sizes = jnp.full((experts,), per_expert, dtype=jnp.int32)
    return lhs, rhs, sizes, per_expert


def workload(lhs, rhs, group_sizes, max_expert_size):
    experts = rhs.shape[0]
    rows, depth = lhs.shape
    width = rhs.shape[2]

    ends = jnp.cumsum(group_sizes)
    starts = jnp.concatenate([jnp.zeros(1, dtype=jnp.int32), ends[:-1]])
    padded = jnp.zeros((rows + max_expert_size, width), dtype=lhs.dtype)

    def one_expert(acc, e):
        first, count = starts[e], group_sizes[e]
        window = jax.lax.dynamic_slice(lhs, (first, 0), (max_expert_size, depth))
        prod = jax.lax.dot(window, rhs[e, :, :], preferred_element_type=jnp.float32)
        keep = jax.lax.broadcasted_iota(jnp.int32, (max_expert_size, width), 0) < count
        prod = jnp.where(keep, prod, 0.0)
        old = jax.lax.dynamic_slice(acc, (first, 0), (max_expert_size, width))
        acc = jax.lax.dynamic_update_slice(acc, old + prod.astype(acc.dtype), (first, 0))
        return acc, None

    padded, _ = jax.lax.scan(one_expert, padded, jnp.arange(experts))
    return padded[:rows, :]
