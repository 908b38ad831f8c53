"""Mirrors JAXBench's formulation of 21k (KernelBench L2 #14): x @ W.T through a
HIGHEST-precision dot_general, halved, summed over the features (kept as a column) and
scaled."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "14_Gemm_Divide_Sum_Scaling",
    "batch_size": 4096,
    "input_size": 8192,
    "hidden_size": 8192,
    "scaling_factor": 1.5,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) and the (hidden, input) weight N(0,1), unscaled, from split(key(0), 2)."""
    kx, kw = jax.random.split(jax.random.key(0), 2)
    acts = jax.random.uniform(kx, (CONFIG["batch_size"], CONFIG["input_size"]), dtype=dtype)
    w = jax.random.normal(kw, (CONFIG["hidden_size"], CONFIG["input_size"]), dtype=dtype)
    return acts, w


def workload(x, weight):
    contract = (((1,), (0,)), ((), ()))  # rows of x against the columns of weight.T
    h = jax.lax.dot_general(x, weight.T, dimension_numbers=contract, precision=jax.lax.Precision.HIGHEST)
    h = h / 2.0
    h = jnp.sum(h, axis=1, keepdims=True)
    return h * CONFIG["scaling_factor"]
