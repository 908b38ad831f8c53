"""22k conv2d_instancenorm_divide: mirrors JAXBench's formulation of 22k (KernelBench L2 #17).

A 3x3 VALID convolution computed channels-last plus its bias, back to channels-first, then
instance normalisation over (H, W) per (sample, channel) with eps 1e-5 and an affine
scale/shift, then a division by 2.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "17_Conv2d_InstanceNorm_Divide",
    "batch_size": 128,
    "in_channels": 64,
    "out_channels": 128,
    "kernel_size": 3,
    "divide_by": 2.0,
}

SIDE = 128


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    images = jax.random.uniform(jax.random.PRNGKey(0), (n, cin, SIDE, SIDE), dtype=dtype)
    filters = jnp.zeros((cout, cin, k, k), dtype=dtype)
    return (images, filters, jnp.zeros((cout,), dtype=dtype), jnp.ones((cout,), dtype=dtype),
            jnp.zeros((cout,), dtype=dtype))


def workload(x, weight, conv_bias, in_weight, in_bias):
    lhs = jnp.transpose(x, (0, 2, 3, 1))
    rhs = jnp.transpose(weight, (2, 3, 1, 0))
    y = jax.lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1), padding="VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jnp.transpose(y + conv_bias.reshape(1, 1, 1, -1), (0, 3, 1, 2))
    mu = jnp.mean(y, axis=(2, 3), keepdims=True)
    sigma2 = jnp.var(y, axis=(2, 3), keepdims=True)
    y = (y - mu) / jnp.sqrt(sigma2 + 1e-5)
    y = y * in_weight.reshape(1, -1, 1, 1) + in_bias.reshape(1, -1, 1, 1)
    return y / 2.0
