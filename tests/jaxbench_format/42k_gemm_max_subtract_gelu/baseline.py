"""Mirrors JAXBench's formulation of 42k (KernelBench L2 #80 as modified by JAXBench's
aa6005e fix): v = x @ W + b, the row maximum (keepdims) subtracted, then GELU, at the
full (batch, out_features) shape."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "80_Gemm_Max_Subtract_GELU",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "max_dim": 1,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1), the (in, out) weight and the bias N(0,1)*0.02, from split(key(0), 3)."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    acts = jax.random.uniform(kx, (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    v = jnp.matmul(x, weight) + bias
    peak = jnp.max(v, axis=CONFIG["max_dim"], keepdims=True)
    return jax.nn.gelu(v - peak)
