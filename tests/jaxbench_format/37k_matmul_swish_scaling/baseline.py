"""Mirrors JAXBench's formulation of 37k (KernelBench L2 #59): a linear layer, swish written
as v * sigmoid(v), then a scale."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "59_Matmul_Swish_Scaling",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "scaling_factor": 2.0,
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
    v = v * jax.nn.sigmoid(v)
    return v * CONFIG["scaling_factor"]
