"""Mirrors JAXBench's formulation of 30k (KernelBench L2 #40): v = x @ W + b, then
v * scaling_factor + v."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "40_Matmul_Scaling_ResidualAdd",
    "batch_size": 16384,
    "in_features": 4096,
    "out_features": 4096,
    "scaling_factor": 0.5,
}


def create_inputs(dtype=jnp.float32):
    """Activations U[0,1) from key 0; the (in, out) weight and the bias N(0,1)*0.02."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb = jax.random.split(jax.random.key(0xBADC0DE), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    v = jnp.matmul(x, weight) + bias
    return v * CONFIG["scaling_factor"] + v
