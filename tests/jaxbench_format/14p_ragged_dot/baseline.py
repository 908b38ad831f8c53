"""14p ragged_dot: mirrors JAXBench's formulation of 14p (Mixtral-8x7B grouped matmul).

Equal-sized groups of rows, each multiplied by its own weight matrix: one batched einsum
over the group axis.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "mixtral_8x7b_ragged_dot",
    "model": "Mixtral-8x7B",
    "operator": "ragged_dot",
    "num_groups": 8,
    "M": 8192,
    "K": 4096,
    "N": 14336,
}


def create_inputs(dtype=jnp.bfloat16):
    groups, rows, depth, cols = (CONFIG[k] for k in ("num_groups", "M", "K", "N"))
    k_lhs, k_rhs = jax.random.split(jax.random.PRNGKey(42), 2)
    lhs = jax.random.normal(k_lhs, (groups, rows // groups, depth), dtype=dtype)
    rhs = 0.02 * jax.random.normal(k_rhs, (groups, depth, cols), dtype=dtype)
    return lhs, rhs


def workload(x, weights):
    return jnp.einsum("grk,gkc->grc", x, weights)
