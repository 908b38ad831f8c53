"""Mirrors JAXBench's formulation of 44k (KernelBench L2 #86): a linear layer, a division by
a constant, then GELU."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "86_Matmul_Divide_GELU",
    "batch_size": 4096,
    "input_size": 8192,
    "output_size": 8192,
    "divisor": 10.0,
}


def create_inputs(dtype=jnp.float32):
    """Activations U[0,1) from key 0; the (input, output) weight and the bias N(0,1)*0.02."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["input_size"], CONFIG["output_size"]
    kw, kb = jax.random.split(jax.random.key(0xBADC0DE), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    h = x @ weight + bias
    return jax.nn.gelu(h / CONFIG["divisor"])
