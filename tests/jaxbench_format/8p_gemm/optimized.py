"""8p gemm, optimized: mirrors JAXBench's expert file for 8p.

Calls the Pallas TPU matmul kernel that ships with jax
(``jax.experimental.pallas.ops.tpu.matmul``) with JAXBench's tuned tiling: output blocks
of 1024 x 2048 and a contraction block of 1024.
"""
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.matmul import matmul

CONFIG = {
    "name": "pallas_matmul_llama70b",
    "model": "Llama-3.1-70B",
    "operator": "pallas_matmul",
    "M": 8192,
    "K": 8192,
    "N": 28672,
    "atol": 1e-3,
    "rtol": 1e-2,
}

# (bm, bn) output block and bk contraction block, as JAXBench tuned them for v6e
TUNED_PARAMS = {"block_shape": [1024, 2048], "block_k": 1024}


def create_inputs(dtype=jnp.bfloat16):
    rows, depth, cols = CONFIG["M"], CONFIG["K"], CONFIG["N"]
    key_x, key_y = jax.random.split(jax.random.PRNGKey(42), 2)
    x = jax.random.normal(key_x, (rows, depth), dtype=dtype)
    y = 0.02 * jax.random.normal(key_y, (depth, cols), dtype=dtype)
    return x, y


def workload(x, y):
    blocks = tuple(TUNED_PARAMS["block_shape"])
    with jax.named_scope("bench_kernel"):
        return matmul(x, y, block_shape=blocks, block_k=TUNED_PARAMS["block_k"])
