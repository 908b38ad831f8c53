"""Mirrors JAXBench's formulation of 24k (KernelBench L2 #22): x @ W.T + b, scaled, added to
itself, clamped, reduced by a row logsumexp, then multiplied by its own mish."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish",
    "batch_size": 4096,
    "input_size": 8192,
    "hidden_size": 8192,
    "scale_factor": 2.0,
    "clamp_min": -10.0,
    "clamp_max": 10.0,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (hidden, input) weight and the bias N(0,1)*0.02 from split(key(42), 2)."""
    kw, kb = jax.random.split(jax.random.key(42), 2)
    acts = jax.random.uniform(jax.random.key(0), (CONFIG["batch_size"], CONFIG["input_size"]), dtype=dtype)
    w = jax.random.normal(kw, (CONFIG["hidden_size"], CONFIG["input_size"]), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (CONFIG["hidden_size"],), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    h = jnp.matmul(x, weight.T) + bias
    h = h * CONFIG["scale_factor"]
    h = h + h
    h = jnp.clip(h, CONFIG["clamp_min"], CONFIG["clamp_max"])
    lse = jax.scipy.special.logsumexp(h, axis=1, keepdims=True)
    sp = jnp.logaddexp(lse, 0.0)  # softplus
    return lse * (lse * jnp.tanh(sp))
