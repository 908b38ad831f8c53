"""46k conv2d_groupnorm_tanh_hardswish_residualadd_logsumexp: mirrors JAXBench's formulation
of 46k (KernelBench L2 #92).

A 3x3 VALID convolution computed channels-last plus its bias, back to channels-first (c);
GroupNorm with 16 groups (eps 1e-5) and a per-channel affine; tanh; hard-swish written as
t * min(max(t + 3, 0), 6) / 6; residual add of c; logsumexp over the channel axis, keepdims.
"""
import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

CONFIG = {
    "name": "92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp",
    "batch_size": 128,
    "in_channels": 8,
    "out_channels": 64,
    "kernel_size": 3,
    "groups": 16,
}

SIDE = 128


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    images = jax.random.uniform(jax.random.PRNGKey(0), (n, cin, SIDE, SIDE), dtype=dtype)
    filters = jnp.zeros((cout, cin, k, k), dtype=dtype)
    return (images, filters, jnp.zeros((cout,), dtype=dtype), jnp.ones((cout,), dtype=dtype),
            jnp.zeros((cout,), dtype=dtype))


def workload(x, conv_weight, conv_bias, gn_weight, gn_bias):
    groups, eps = 16, 1e-5
    lhs = jnp.transpose(x, (0, 2, 3, 1))
    rhs = jnp.transpose(conv_weight, (2, 3, 1, 0))
    c = jax.lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1), padding="VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = jnp.transpose(c + conv_bias.reshape(1, 1, 1, -1), (0, 3, 1, 2))
    n, ch, h, w = c.shape
    grouped = c.reshape(n, groups, ch // groups, h, w)
    mu = jnp.mean(grouped, axis=(2, 3, 4), keepdims=True)
    sigma2 = jnp.var(grouped, axis=(2, 3, 4), keepdims=True)
    normed = ((grouped - mu) / jnp.sqrt(sigma2 + eps)).reshape(n, ch, h, w)
    normed = normed * gn_weight.reshape(1, -1, 1, 1) + gn_bias.reshape(1, -1, 1, 1)
    t = jnp.tanh(normed)
    hswish = t * jnp.minimum(jnp.maximum(t + 3, 0), 6) / 6
    return logsumexp(c + hswish, axis=1, keepdims=True)
