"""25k conv3d_groupnorm_mean: mirrors JAXBench's formulation of 25k (KernelBench L2 #23).

A 3x3x3 VALID convolution computed channels-last plus its bias, back to channels-first,
GroupNorm with 8 groups (statistics over the group's channels and D, H, W; eps 1e-5) and a
per-channel affine, then the mean over everything but the batch axis.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "23_Conv3d_GroupNorm_Mean",
    "batch_size": 128,
    "in_channels": 3,
    "out_channels": 24,
    "kernel_size": 3,
    "num_groups": 8,
}

VOLUME = (24, 32, 32)  # depth, height, width


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    vol = jax.random.uniform(jax.random.PRNGKey(0), (n, cin, *VOLUME), dtype=dtype)
    filters = jnp.zeros((cout, cin, k, k, k), dtype=dtype)
    return (vol, filters, jnp.zeros((cout,), dtype=dtype), jnp.ones((cout,), dtype=dtype),
            jnp.zeros((cout,), dtype=dtype))


def workload(x, weight, conv_bias, gamma, beta):
    groups = 8
    lhs = jnp.transpose(x, (0, 2, 3, 4, 1))
    rhs = jnp.transpose(weight, (2, 3, 4, 1, 0))
    y = jax.lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1, 1), padding="VALID",
                                     dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
    y = jnp.transpose(y + conv_bias.reshape(1, 1, 1, 1, -1), (0, 4, 1, 2, 3))
    n, c, d, h, w = y.shape
    grouped = y.reshape(n, groups, c // groups, d, h, w)
    mu = jnp.mean(grouped, axis=(2, 3, 4, 5), keepdims=True)
    sigma2 = jnp.var(grouped, axis=(2, 3, 4, 5), keepdims=True)
    normed = ((grouped - mu) / jnp.sqrt(sigma2 + 1e-5)).reshape(n, c, d, h, w)
    normed = normed * gamma.reshape(1, -1, 1, 1, 1) + beta.reshape(1, -1, 1, 1, 1)
    return jnp.mean(normed, axis=(1, 2, 3, 4))
