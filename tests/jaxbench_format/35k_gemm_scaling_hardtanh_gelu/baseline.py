"""Mirrors JAXBench's formulation of 35k (KernelBench L2 #53): a linear layer, a scale, a
hardtanh clip, then the tanh-approximation GELU written out term by term."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "53_Gemm_Scaling_Hardtanh_GELU",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "scaling_factor": 0.5,
    "hardtanh_min": -2,
    "hardtanh_max": 2,
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
    h = jnp.matmul(x, weight) + bias
    h = h * CONFIG["scaling_factor"]
    h = jnp.clip(h, CONFIG["hardtanh_min"], CONFIG["hardtanh_max"])
    inner = jnp.sqrt(2.0 / jnp.pi) * (h + 0.044715 * h**3)
    return h * 0.5 * (1.0 + jnp.tanh(inner))
