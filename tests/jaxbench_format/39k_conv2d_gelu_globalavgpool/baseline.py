"""39k conv2d_gelu_globalavgpool: mirrors JAXBench's formulation of 39k (KernelBench L2 #67).

A 3x3 VALID convolution computed channels-last plus its bias, tanh-GELU, then the mean over
the spatial axes (global average pool), giving (N, C).
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "67_Conv2d_GELU_GlobalAvgPool",
    "batch_size": 128,
    "in_channels": 8,
    "out_channels": 64,
    "kernel_size": 3,
}

SIDE = 256


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    images = jax.random.uniform(jax.random.PRNGKey(0), (n, cin, SIDE, SIDE), dtype=dtype)
    return images, jnp.zeros((cout, cin, k, k), dtype=dtype), jnp.zeros((cout,), dtype=dtype)


def workload(x, weight, bias):
    lhs = jnp.transpose(x, (0, 2, 3, 1))
    rhs = jnp.transpose(weight, (2, 3, 1, 0))
    v = jax.lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1), padding="VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    v = jax.nn.gelu(v + bias.reshape(1, 1, 1, -1))
    return jnp.mean(v, axis=(1, 2))
