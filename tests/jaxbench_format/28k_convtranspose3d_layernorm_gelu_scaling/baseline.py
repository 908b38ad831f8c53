"""28k convtranspose3d_layernorm_gelu_scaling: mirrors JAXBench's formulation of 28k
(KernelBench L2 #34).

ConvTranspose3d (kernel 4, stride 2, padding 1) written as: go channels-last, scatter the
input into a zero-filled array at every second position (the zero-inserted input), and run a
stride-1 convolution of it with the spatially flipped kernel, padded by k - 1 - padding on
each side; plus the conv bias, back to channels-first; LayerNorm over the last axis (eps
1e-5) with ln_weight/ln_bias broadcast along it; tanh-GELU; times the scaling factor.
"""
import jax
import jax.numpy as jnp
from jax import lax

CONFIG = {
    "name": "34_ConvTranspose3d_LayerNorm_GELU_Scaling",
    "batch_size": 32,
    "in_channels": 32,
    "out_channels": 64,
    "kernel_size": 4,
    "stride": 2,
    "padding": 1,
    "bias": True,
    "eps": 1e-05,
    "scaling_factor": 1.0,
}

VOLUME = (16, 32, 32)  # depth, height, width of the input


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    key_x, key_w = jax.random.split(jax.random.PRNGKey(0))
    vol = jax.random.uniform(key_x, (n, cin, *VOLUME), dtype=dtype)
    filters = jax.random.normal(key_w, (cin, cout, k, k, k), dtype=dtype)
    return (vol, filters, jnp.zeros((cout,), dtype=dtype), jnp.ones((cout,), dtype=dtype),
            jnp.zeros((cout,), dtype=dtype))


def workload(x, conv_weight, conv_bias, ln_weight, ln_bias):
    step, crop, k, eps, scale = 2, 1, 4, 1e-5, 1.0
    cl = jnp.transpose(x, (0, 2, 3, 4, 1))
    taps = jnp.flip(jnp.transpose(conv_weight, (2, 3, 4, 1, 0)), axis=(0, 1, 2))
    n, d, h, w, c = cl.shape
    grown = jnp.zeros((n, (d - 1) * step + 1, (h - 1) * step + 1, (w - 1) * step + 1, c), dtype=cl.dtype)
    grown = grown.at[:, ::step, ::step, ::step, :].set(cl)
    edge = k - 1 - crop
    y = lax.conv_general_dilated(grown, taps, window_strides=(1, 1, 1), padding=((edge, edge),) * 3,
                                 dimension_numbers=("NDHWC", "DHWOI", "NDHWC"))
    y = jnp.transpose(y + conv_bias.reshape(1, 1, 1, 1, -1), (0, 4, 1, 2, 3))
    mu = jnp.mean(y, axis=-1, keepdims=True)
    sigma2 = jnp.mean((y - mu) ** 2, axis=-1, keepdims=True)
    y = (y - mu) / jnp.sqrt(sigma2 + eps) * ln_weight + ln_bias
    return jax.nn.gelu(y) * scale
