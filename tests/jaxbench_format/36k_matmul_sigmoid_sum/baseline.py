"""Mirrors JAXBench's formulation of 36k (KernelBench L2 #56): a linear layer, sigmoid, and
the sum over the features kept as a column."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "56_Matmul_Sigmoid_Sum",
    "batch_size": 4096,
    "input_size": 8192,
    "hidden_size": 8192,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (input, hidden) weight and the bias N(0,1)*0.02 from split(key(42), 2)."""
    kw, kb = jax.random.split(jax.random.key(42), 2)
    acts = jax.random.uniform(jax.random.key(0), (CONFIG["batch_size"], CONFIG["input_size"]), dtype=dtype)
    w = jax.random.normal(kw, (CONFIG["input_size"], CONFIG["hidden_size"]), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (CONFIG["hidden_size"],), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    h = jax.nn.sigmoid(jnp.matmul(x, weight) + bias)
    return jnp.sum(h, axis=1, keepdims=True)
