"""Mirrors JAXBench's formulation of 23k (KernelBench L2 #18): x @ W.T + b summed over the
features to one column, then max, mean and two logsumexps, each over that size-1 axis."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
}


def create_inputs(dtype=jnp.float32):
    """Activations U[0,1) from key 0; the (out, in) weight and the bias N(0,1)*0.02."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb = jax.random.split(jax.random.key(0xBADC0DE), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    h = jnp.matmul(x, weight.T) + bias
    h = jnp.sum(h, axis=1, keepdims=True)
    h = jnp.max(h, axis=1, keepdims=True)
    h = jnp.mean(h, axis=1, keepdims=True)
    h = jax.scipy.special.logsumexp(h, axis=1, keepdims=True)
    return jax.scipy.special.logsumexp(h, axis=1, keepdims=True)
