"""11p megablox_gmm, optimized: mirrors JAXBench's expert file for 11p.

Calls jax's shipped megablox grouped matmul (``jax.experimental.pallas.ops.tpu.megablox.gmm``)
with JAXBench's tuned tiling (tm, tk, tn) = (256, 1024, 1024) and the kernel's default
float32 output. The static window bound, JAXBench's fourth argument, is not needed by the
kernel.
"""
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm

CONFIG = {
    "name": "pallas_megablox_gmm_qwen3_235b",
    "model": "Qwen3-235B-A22B",
    "operator": "pallas_gmm",
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "emb_dim": 4096,
    "moe_mlp_dim": 1536,
    "seq_len": 4096,
    "atol": 1e-3,
    "rtol": 1e-2,
}

# (tm, tk, tn), as JAXBench tuned them for v6e
TUNED_PARAMS = {"tiling": [256, 1024, 1024]}


def create_inputs(dtype=jnp.bfloat16):
    experts, depth, width = CONFIG["num_experts"], CONFIG["emb_dim"], CONFIG["moe_mlp_dim"]
    rows = CONFIG["seq_len"] * CONFIG["num_experts_per_tok"]
    key_lhs, key_rhs = jax.random.split(jax.random.PRNGKey(42), 2)
    lhs = jax.random.normal(key_lhs, (rows, depth), dtype=dtype)
    rhs = 0.02 * jax.random.normal(key_rhs, (experts, depth, width), dtype=dtype)
    per_expert = rows // experts
    sizes = jnp.full((experts,), per_expert, dtype=jnp.int32)
    return lhs, rhs, sizes, per_expert


def workload(lhs, rhs, group_sizes, max_expert_size):
    del max_expert_size  # the kernel walks the groups from group_sizes alone
    with jax.named_scope("bench_kernel"):
        return gmm(lhs, rhs, group_sizes, tiling=tuple(TUNED_PARAMS["tiling"]))
