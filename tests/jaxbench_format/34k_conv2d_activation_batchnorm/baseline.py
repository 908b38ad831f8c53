"""34k conv2d_activation_batchnorm: mirrors JAXBench's formulation of 34k (KernelBench L2 #52).

A 3x3 VALID convolution computed channels-last plus its bias, back to channels-first, Mish
as tanh(softplus(v)) * v, then training-mode BatchNorm: per-channel mean and biased variance
over (N, H, W), eps 1e-5, affine scale/shift.
"""
import jax
import jax.numpy as jnp
from jax import lax

CONFIG = {
    "name": "52_Conv2d_Activation_BatchNorm",
    "batch_size": 64,
    "in_channels": 64,
    "out_channels": 128,
    "kernel_size": 3,
}

SIDE = 128


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
    images = jax.random.uniform(kx, (n, cin, SIDE, SIDE), dtype=dtype)
    filters = jax.random.normal(kw, (cout, cin, k, k), dtype=dtype)
    filter_bias = jax.random.normal(kb, (cout,), dtype=dtype)
    return images, filters, filter_bias, jnp.ones((cout,), dtype=dtype), jnp.zeros((cout,), dtype=dtype)


def workload(x, conv_weight, conv_bias, bn_weight, bn_bias):
    lhs = jnp.transpose(x, (0, 2, 3, 1))
    rhs = jnp.transpose(conv_weight, (2, 3, 1, 0))
    v = lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1), padding="VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    v = jnp.transpose(v + conv_bias.reshape(1, 1, 1, -1), (0, 3, 1, 2))
    v = jnp.multiply(jnp.tanh(jax.nn.softplus(v)), v)
    mu = jnp.mean(v, axis=(0, 2, 3), keepdims=True)
    sigma2 = jnp.mean((v - mu) ** 2, axis=(0, 2, 3), keepdims=True)
    return (v - mu) / jnp.sqrt(sigma2 + 1e-5) * bn_weight.reshape(1, -1, 1, 1) + bn_bias.reshape(1, -1, 1, 1)
