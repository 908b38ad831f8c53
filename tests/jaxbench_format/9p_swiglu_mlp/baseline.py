"""9p swiglu_mlp: mirrors JAXBench's formulation of 9p (Llama-3.1-70B SwiGLU MLP).

Two projections of the tokens, the gate one through SiLU, their product projected back
down: (silu(x @ W_gate) * (x @ W_up)) @ W_down, every product in the input dtype.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_70b_swiglu",
    "model": "Llama-3.1-70B",
    "operator": "swiglu_mlp",
    "batch": 2,
    "seq_len": 4096,
    "emb_dim": 8192,
    "mlp_dim": 28672,
}


def create_inputs(dtype=jnp.bfloat16):
    width, hidden = CONFIG["emb_dim"], CONFIG["mlp_dim"]
    k_x, k_gate, k_up, k_down = jax.random.split(jax.random.PRNGKey(42), 4)

    def weight(k, shape):
        return jax.random.normal(k, shape, dtype=dtype) * 0.02

    x = jax.random.normal(k_x, (CONFIG["batch"], CONFIG["seq_len"], width), dtype=dtype)
    return x, weight(k_gate, (width, hidden)), weight(k_up, (width, hidden)), weight(k_down, (hidden, width))


def workload(x, gate_kernel, up_kernel, down_kernel):
    activated = jax.nn.silu(jnp.dot(x, gate_kernel))
    linear = jnp.dot(x, up_kernel)
    return jnp.dot(activated * linear, down_kernel)
