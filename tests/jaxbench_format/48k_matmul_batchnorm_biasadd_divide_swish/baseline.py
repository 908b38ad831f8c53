"""Mirrors JAXBench's formulation of 48k (KernelBench L2 #97): x @ W + b, eval-mode BatchNorm
from the supplied running statistics, a scalar bias added, a division, then swish."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "97_Matmul_BatchNorm_BiasAdd_Divide_Swish",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "bn_eps": 1e-05,
    "bn_momentum": 0.1,
    "divide_value": 1.0,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (in, out) weight, the linear bias and the (1,) bias
    N(0,1)*0.02 from split(key(0xBADC0DE), 3); running mean zeros and variance ones, the
    norm's scale ones and bias zeros."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb, ks = jax.random.split(jax.random.key(0xBADC0DE), 3)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    lin_b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    scalar_b = jax.random.normal(ks, (1,), dtype=dtype) * 0.02
    ones, zeros = jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype)
    return acts, w, lin_b, ones, zeros, zeros, ones, scalar_b


def workload(x, weight, linear_bias, bn_scale, bn_bias, bn_mean, bn_var, bias):
    h = jnp.matmul(x, weight) + linear_bias
    normed = (h - bn_mean) / jnp.sqrt(bn_var + CONFIG["bn_eps"])
    h = bn_scale * normed + bn_bias
    h = (h + bias) / CONFIG["divide_value"]
    return h * jax.nn.sigmoid(h)
