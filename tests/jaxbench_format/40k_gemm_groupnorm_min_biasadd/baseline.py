"""Mirrors JAXBench's formulation of 40k (KernelBench L2 #75): x @ W.T + b, GroupNorm with
an affine, the minimum over the features, reshaped to (1, 1, N, 1) and added to a
(1, C, 1, 1) bias, which broadcasts to (1, C, N, 1)."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "75_Gemm_GroupNorm_Min_BiasAdd",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "num_groups": 512,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (out, in) weight, the linear bias and the (1, C, 1, 1) bias
    N(0,1)*0.02 from split(key(0xBADC0DE), 3); the norm's weight ones and bias zeros."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb, kbias = jax.random.split(jax.random.key(0xBADC0DE), 3)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype) * 0.02
    lin_b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    extra = jax.random.normal(kbias, (1, fan_out, 1, 1), dtype=dtype) * 0.02
    ones, zeros = jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype)
    return acts, w, lin_b, ones, zeros, extra


def workload(x, weight, linear_bias, gn_weight, gn_bias, bias):
    h = jnp.matmul(x, weight.T) + linear_bias
    rows, width = h.shape
    groups = CONFIG["num_groups"]
    g = h.reshape(rows, groups, width // groups)
    mu = jnp.mean(g, axis=2, keepdims=True)
    var = jnp.var(g, axis=2, keepdims=True)
    g = (g - mu) / jnp.sqrt(var + 1e-5)
    h = g.reshape(rows, width) * gn_weight + gn_bias
    low = jnp.min(h, axis=1, keepdims=True)
    return low.reshape(1, 1, rows, 1) + bias
