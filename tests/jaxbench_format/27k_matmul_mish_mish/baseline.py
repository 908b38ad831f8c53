"""Mirrors JAXBench's formulation of 27k (KernelBench L2 #29): a linear layer followed by
mish applied twice (mish(v) = v * tanh(softplus(v)))."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "29_Matmul_Mish_Mish",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
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
    h = x @ weight + bias
    for _ in range(2):
        h = h * jnp.tanh(jax.nn.softplus(h))
    return h
