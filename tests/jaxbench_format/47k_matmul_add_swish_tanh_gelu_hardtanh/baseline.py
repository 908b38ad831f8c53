"""Mirrors JAXBench's formulation of 47k (KernelBench L2 #95): x @ W + b, an added vector,
swish, tanh, GELU, then a hardtanh clip to [-1, 1]."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (in, out) weight, the bias and add_value N(0,1)*0.02 from
    split(key(0xBADC0DE), 3)."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb, ka = jax.random.split(jax.random.key(0xBADC0DE), 3)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    add = jax.random.normal(ka, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b, add


def workload(x, weight, bias, add_value):
    h = x @ weight + bias
    h = h + add_value
    h = jnp.tanh(jax.nn.swish(h))
    return jnp.clip(jax.nn.gelu(h), -1.0, 1.0)
