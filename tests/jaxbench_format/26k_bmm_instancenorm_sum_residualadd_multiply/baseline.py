"""Mirrors JAXBench's formulation of 26k (KernelBench L2 #28): x @ W.T + b viewed as
(N, C, 1, 1), instance-normed over the 1x1 extent with an affine, then (. + y) * y."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "28_BMM_InstanceNorm_Sum_ResidualAdd_Multiply",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
}


def create_inputs(dtype=jnp.float32):
    """x, y U[0,1) from split(key(0), 2); weight, bias and the norm's bias N(0,1)*0.02 from
    split(key(42), 3); the norm's weight ones."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kx, ky = jax.random.split(jax.random.key(0), 2)
    kw, kb, kib = jax.random.split(jax.random.key(42), 3)
    acts = jax.random.uniform(kx, (rows, fan_in), dtype=dtype)
    resid = jax.random.uniform(ky, (rows, fan_out), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    norm_w = jnp.ones((fan_out,), dtype=dtype)
    norm_b = jax.random.normal(kib, (fan_out,), dtype=dtype) * 0.02
    return acts, resid, w, b, norm_w, norm_b


def workload(x, y, bmm_weight, bmm_bias, in_weight, in_bias):
    h = x @ bmm_weight.T + bmm_bias
    h = h[:, :, None, None]  # (N, C) -> (N, C, 1, 1)
    mu = jnp.mean(h, axis=(2, 3), keepdims=True)
    var = jnp.var(h, axis=(2, 3), keepdims=True)
    h = (h - mu) / jnp.sqrt(var + 1e-5)
    h = h * in_weight.reshape(1, -1, 1, 1) + in_bias.reshape(1, -1, 1, 1)
    h = h[:, :, 0, 0]
    h = h + y
    return h * y
