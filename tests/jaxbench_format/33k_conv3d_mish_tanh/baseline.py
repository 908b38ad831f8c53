"""33k conv3d_mish_tanh: mirrors JAXBench's formulation of 33k (KernelBench L2 #47).

A 3x3x3 convolution (explicit zero padding) computed channels-last plus its bias, Mish with
softplus written as log(1 + exp(v)), tanh, then back to channels-first.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "47_Conv3d_Mish_Tanh",
    "batch_size": 16,
    "in_channels": 32,
    "out_channels": 64,
    "kernel_size": 3,
}

VOLUME = (32, 64, 64)


def create_inputs(dtype=jnp.float32):
    n, cin, cout, k = (CONFIG[name] for name in ("batch_size", "in_channels", "out_channels", "kernel_size"))
    vol = jax.random.uniform(jax.random.PRNGKey(0), (n, cin, *VOLUME), dtype=dtype)
    return vol, jnp.zeros((cout, cin, k, k, k), dtype=dtype), jnp.zeros((cout,), dtype=dtype)


def workload(x, weight, bias):
    lhs = jnp.transpose(x, (0, 2, 3, 4, 1))
    rhs = jnp.transpose(weight, (2, 3, 4, 1, 0))
    v = jax.lax.conv_general_dilated(lhs, rhs, window_strides=(1, 1, 1), padding=((0, 0), (0, 0), (0, 0)),
                                     dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
    v = v + bias.reshape(1, 1, 1, 1, -1)
    v = v * jnp.tanh(jnp.log(1 + jnp.exp(v)))
    v = jnp.tanh(v)
    return jnp.transpose(v, (0, 4, 1, 2, 3))
