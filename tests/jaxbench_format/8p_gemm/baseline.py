"""8p gemm: mirrors JAXBench's formulation of 8p (Llama-3.1-70B FFN projection).

One dense bf16 matrix product, C = A @ B, left to XLA.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "gemm_llama70b",
    "model": "Llama-3.1-70B",
    "operator": "dense_matmul",
    "M": 8192,
    "K": 8192,
    "N": 28672,
}


def create_inputs(dtype=jnp.bfloat16):
    rows, depth, cols = CONFIG["M"], CONFIG["K"], CONFIG["N"]
    key_a, key_b = jax.random.split(jax.random.PRNGKey(42), 2)
    a = jax.random.normal(key_a, (rows, depth), dtype=dtype)
    b = 0.02 * jax.random.normal(key_b, (depth, cols), dtype=dtype)
    return a, b


def workload(A, B):
    with jax.named_scope("bench_kernel"):
        return jnp.dot(A, B)
