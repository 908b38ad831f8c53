"""Mirrors JAXBench's formulation of 29k (KernelBench L2 #37): x @ W (no bias inside),
swish, a bias added, then GroupNorm over groups of adjacent features with an affine."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "37_Matmul_Swish_Sum_GroupNorm",
    "batch_size": 8192,
    "in_features": 4096,
    "out_features": 4096,
    "num_groups": 64,
}


def create_inputs(dtype=jnp.float32):
    """Activations U[0,1) from key 0; the (in, out) weight and the bias N(0,1)*0.02; the
    norm's weight ones and bias zeros."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb = jax.random.split(jax.random.key(0xBADC0DE), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b, jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype)


def workload(x, weight, bias, gn_weight, gn_bias):
    groups, width = CONFIG["num_groups"], CONFIG["out_features"]
    h = jnp.matmul(x, weight)
    h = jax.nn.sigmoid(h) * h
    h = h + bias
    g = h.reshape(-1, groups, width // groups)
    mu = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.var(g, axis=-1, keepdims=True)
    g = (g - mu) / jnp.sqrt(var + 1e-5)
    return g.reshape(-1, width) * gn_weight + gn_bias
