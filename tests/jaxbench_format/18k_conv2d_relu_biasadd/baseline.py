"""18k conv2d_relu_biasadd: mirrors JAXBench's formulation of 18k (KernelBench L2 #1).

A 3x3 VALID convolution computed channels-last, plus the conv bias, ReLU, back to
channels-first, plus a (C, 1, 1) bias.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "1_Conv2D_ReLU_BiasAdd",
    "batch_size": 128,
    "in_channels": 64,
    "out_channels": 128,
    "kernel_size": 3,
}

SIDE = 128  # image height and width


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    image_key, _ = jax.random.split(jax.random.PRNGKey(0))
    images = jax.random.uniform(image_key, (n, cin, SIDE, SIDE), dtype=dtype)
    filters = jnp.zeros((cout, cin, k, k), dtype=dtype)
    filter_bias = jnp.zeros((cout,), dtype=dtype)
    extra_bias = jnp.zeros((cout, 1, 1), dtype=dtype)
    return images, filters, filter_bias, extra_bias


def workload(x, weight, conv_bias, bias):
    nhwc = jnp.transpose(x, (0, 2, 3, 1))
    hwio = jnp.transpose(weight, (2, 3, 1, 0))
    out = jax.lax.conv_general_dilated(nhwc, hwio, window_strides=(1, 1), padding="VALID",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
    out = jax.nn.relu(out + conv_bias.reshape(1, 1, 1, -1))
    return jnp.transpose(out, (0, 3, 1, 2)) + bias
