"""Mirrors JAXBench's formulation of 32k (KernelBench L2 #45): two linear layers with a
sigmoid between them, then a logsumexp over the output features (no keepdims)."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "45_Gemm_Sigmoid_LogSumExp",
    "batch_size": 16384,
    "input_size": 2048,
    "hidden_size": 4096,
    "output_size": 1024,
}


def create_inputs(dtype=jnp.float32):
    """x U[0,1) from key 0; w1, b1, w2, b2 N(0,1)*0.02 from split(key(42), 4)."""
    n_in, n_hid, n_out = CONFIG["input_size"], CONFIG["hidden_size"], CONFIG["output_size"]
    k1, k2, k3, k4 = jax.random.split(jax.random.key(42), 4)
    acts = jax.random.uniform(jax.random.key(0), (CONFIG["batch_size"], n_in), dtype=dtype)
    w1 = jax.random.normal(k1, (n_hid, n_in), dtype=dtype) * 0.02
    b1 = jax.random.normal(k2, (n_hid,), dtype=dtype) * 0.02
    w2 = jax.random.normal(k3, (n_out, n_hid), dtype=dtype) * 0.02
    b2 = jax.random.normal(k4, (n_out,), dtype=dtype) * 0.02
    return acts, w1, b1, w2, b2


def workload(x, w1, b1, w2, b2):
    hidden = jax.nn.sigmoid(jnp.matmul(x, w1.T) + b1)
    logits = jnp.matmul(hidden, w2.T) + b2
    return jax.nn.logsumexp(logits, axis=1)
