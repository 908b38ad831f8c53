"""Mirrors JAXBench's formulation of 38k (KernelBench L2 #66): x @ W.T + b and a softmax
over the features; the dropout is the identity (inference)."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "66_Matmul_Dropout_Softmax",
    "batch_size": 4096,
    "in_features": 8192,
    "out_features": 8192,
    "dropout_p": 0.2,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; the (out, in) weight and the bias N(0,1)*0.02 from split(key(42), 2)."""
    rows, fan_in, fan_out = CONFIG["batch_size"], CONFIG["in_features"], CONFIG["out_features"]
    kw, kb = jax.random.split(jax.random.key(42), 2)
    acts = jax.random.uniform(jax.random.key(0), (rows, fan_in), dtype=dtype)
    w = jax.random.normal(kw, (fan_out, fan_in), dtype=dtype) * 0.02
    b = jax.random.normal(kb, (fan_out,), dtype=dtype) * 0.02
    return acts, w, b


def workload(x, weight, bias):
    logits = x @ weight.T + bias  # dropout_p is unused: eval mode
    return jax.nn.softmax(logits, axis=1)
