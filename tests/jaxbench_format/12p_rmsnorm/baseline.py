"""12p rmsnorm: mirrors JAXBench's formulation of 12p (Llama-3.1-70B RMSNorm).

Root-mean-square normalisation over the last axis with the statistics in f32, the
normalised rows cast back to the input dtype and then multiplied by the learned scale.
"""
import jax
import jax.numpy as jnp
from jax import lax

CONFIG = {
    "name": "llama3_70b_rmsnorm",
    "model": "Llama-3.1-70B",
    "operator": "rms_norm",
    "batch": 8,
    "seq_len": 4096,
    "emb_dim": 8192,
    "epsilon": 1e-5,
}


def create_inputs(dtype=jnp.bfloat16):
    k_rows, k_scale = jax.random.split(jax.random.PRNGKey(42), 2)
    width = CONFIG["emb_dim"]
    rows = jax.random.normal(k_rows, (CONFIG["batch"], CONFIG["seq_len"], width), dtype=dtype)
    gain = 1.0 + 0.1 * jax.random.normal(k_scale, (width,), dtype=dtype)
    return rows, gain


def workload(x, scale):
    wide = jnp.asarray(x, jnp.float32)
    mean_square = jnp.mean(lax.square(wide), axis=-1, keepdims=True)
    unit_rms = wide * lax.rsqrt(mean_square + CONFIG["epsilon"])
    return jnp.asarray(unit_rms, x.dtype) * scale
