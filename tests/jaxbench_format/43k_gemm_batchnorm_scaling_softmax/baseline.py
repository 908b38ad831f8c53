"""Mirrors JAXBench's formulation of 43k (KernelBench L2 #84): x @ W + b, eval-mode
BatchNorm from the supplied running statistics, a learned scalar scale, then softmax over
the features."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "84_Gemm_BatchNorm_Scaling_Softmax",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "bn_eps": 1e-05,
    "bn_momentum": 0.1,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (in, out) weight, the bias and bn_bias N(0,1)*0.02 from
    split(key(42), 3); bn_scale ones, running mean zeros, running variance ones, scale ones(1)."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb, kbn = jax.random.split(jax.random.key(42), 3)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    bn_b = jax.random.normal(kbn, (fan_out,), dtype=dtype) * 0.02
    ones, zeros = jnp.ones((fan_out,), dtype=dtype), jnp.zeros((fan_out,), dtype=dtype)
    return acts, w, b, ones, bn_b, zeros, ones, jnp.ones((1,), dtype=dtype)


def workload(x, weight, bias, bn_scale, bn_bias, bn_mean, bn_var, scale):
    h = jnp.matmul(x, weight) + bias
    normed = (h - bn_mean) / jnp.sqrt(bn_var + CONFIG["bn_eps"])
    h = bn_scale * normed + bn_bias
    h = scale * h
    return jax.nn.softmax(h, axis=1)
