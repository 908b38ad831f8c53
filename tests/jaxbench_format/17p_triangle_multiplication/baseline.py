"""17p triangle_multiplication: mirrors JAXBench's formulation of 17p (AlphaFold2 outgoing
triangle multiplicative update).

The masked pair tensor is projected four ways; two sigmoid gates scale the left and right
projections; T[i, j] = sum_k left[i, k] * right[j, k] per channel; T is RMS-normalised over
channels (eps 1e-6, no mean) and scaled; the output projection is gated by a sigmoid of
the unmasked pair tensor's own projection.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "alphafold_768_triangle_mult",
    "model": "AlphaFold2",
    "operator": "triangle_mult_outgoing",
    "N": 1536,
    "C": 128,
    "direction": "outgoing",
}


def create_inputs(dtype=jnp.bfloat16):
    n, c = CONFIG["N"], CONFIG["C"]
    keys = jax.random.split(jax.random.PRNGKey(42), 9)

    def square(k):
        return jax.random.normal(k, (c, c), dtype=dtype) * 0.02

    pair = jax.random.normal(keys[0], (n, n, c), dtype=dtype)
    pair_mask = jnp.ones((n, n, 1), dtype=dtype)
    norm_scale = jax.random.normal(keys[5], (c,), dtype=dtype) * 0.1 + 1.0
    return (pair, pair_mask, square(keys[1]), square(keys[2]), square(keys[3]), square(keys[4]),
            norm_scale, square(keys[6]), square(keys[7]))


def workload(pair_act, mask, left_proj_w, right_proj_w, left_gate_w, right_gate_w, center_scale, out_proj_w,
             out_gate_w):
    masked = pair_act * mask
    lhs = jnp.dot(masked, left_proj_w)
    rhs = jnp.dot(masked, right_proj_w)
    lhs_gate = jax.nn.sigmoid(jnp.dot(masked, left_gate_w))
    rhs_gate = jax.nn.sigmoid(jnp.dot(masked, right_gate_w))
    lhs = lhs * lhs_gate
    rhs = rhs * rhs_gate

    # outgoing edges: contract the shared third residue k
    tri = jnp.einsum("ikc,jkc->ijc", lhs, rhs)

    # RMS over channels, then the learned per-channel scale
    rms = jnp.sqrt(jnp.mean(tri * tri, axis=-1, keepdims=True) + 1e-6)
    tri = tri / rms * center_scale

    projected = jnp.dot(tri, out_proj_w)
    out_gate = jax.nn.sigmoid(jnp.dot(pair_act, out_gate_w))
    return projected * out_gate
