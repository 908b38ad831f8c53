"""Mirrors JAXBench's formulation of 49k (KernelBench L2 #98): x @ W + b, AvgPool1d over the
features as a strided reduce_window sum divided by the window, GELU, a scale, and the
maximum over the pooled features."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "98_Matmul_AvgPool_GELU_Scale_Max",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "pool_kernel_size": 16,
    "scale_factor": 2.0,
}


def create_inputs(dtype=jnp.float32):
    """Activations U[0,1) from key 0; the (in, out) weight and the bias N(0,1)*0.02."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb = jax.random.split(jax.random.key(0xBADC0DE), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_in, fan_out), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    pool = CONFIG["pool_kernel_size"]
    h = jnp.matmul(x, weight) + bias
    h = h[:, None, :]  # (N, 1, L): one channel, pooled along L
    window = (1, 1, pool)
    h = jax.lax.reduce_window(h, 0.0, jax.lax.add, window, window, "VALID") / pool
    h = jax.nn.gelu(h[:, 0, :]) * CONFIG["scale_factor"]
    return jnp.max(h, axis=1)
