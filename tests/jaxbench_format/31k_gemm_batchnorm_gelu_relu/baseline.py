"""Mirrors JAXBench's formulation of 31k (KernelBench L2 #41): x @ W.T + b, BatchNorm1d in
training mode (batch statistics over the rows, eps 1e-5) with an affine, GELU, then ReLU."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "41_Gemm_BatchNorm_GELU_ReLU",
    "batch_size": 16384,
    "in_features": 8192,
    "out_features": 8192,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1), the (out, in) weight and the bias N(0,1) unscaled, from split(key(0), 3);
    the norm's weight ones and bias zeros."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    acts = jax.random.uniform(kx, (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype)
    b = jax.random.normal(kb, (fan_out,), dtype=dtype)
    return acts, w, b, jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype)


def workload(x, gemm_weight, gemm_bias, bn_weight, bn_bias):
    h = jnp.matmul(x, gemm_weight.T) + gemm_bias
    mu = jnp.mean(h, axis=0, keepdims=True)
    var = jnp.mean((h - mu) ** 2, axis=0, keepdims=True)
    h = (h - mu) / jnp.sqrt(var + 1e-5) * bn_weight + bn_bias
    return jax.nn.relu(jax.nn.gelu(h))
