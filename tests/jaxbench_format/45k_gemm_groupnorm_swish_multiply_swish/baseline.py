"""Mirrors JAXBench's formulation of 45k (KernelBench L2 #88): x @ W.T + b, GroupNorm with
an affine, swish, a per-feature multiply, swish again."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "88_Gemm_GroupNorm_Swish_Multiply_Swish",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "num_groups": 256,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (out, in) weight and the bias N(0,1)*0.02 and multiply_weight
    N(0,1) unscaled from split(key(42), 3); the norm's weight ones and bias zeros."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb, km = jax.random.split(jax.random.key(42), 3)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    mult = jax.random.normal(km, (fan_out,), dtype=dtype)
    return acts, w, b, jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype), mult


def workload(x, gemm_weight, gemm_bias, gn_weight, gn_bias, multiply_weight):
    groups, width = CONFIG["num_groups"], CONFIG["out_features"]
    h = jnp.matmul(x, gemm_weight.T) + gemm_bias
    rows = h.shape[0]
    g = h.reshape(rows, groups, width // groups)
    mu = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.var(g, axis=-1, keepdims=True)
    g = (g - mu) / jnp.sqrt(var + 1e-5)
    h = g.reshape(rows, width) * gn_weight + gn_bias
    h = h * jax.nn.sigmoid(h)
    h = h * multiply_weight
    return h * jax.nn.sigmoid(h)
