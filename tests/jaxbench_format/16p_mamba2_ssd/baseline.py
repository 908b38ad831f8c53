"""16p mamba2_ssd: mirrors JAXBench's formulation of 16p (Mamba-2-2.7B SSD, quadratic form).

Per-position decay a = sigmoid(A_log); the segment decay L[i, j] = exp(c_i - c_j) from the
running sum c of log(a + 1e-8), with exp(-1e30) = 0 above the diagonal; the f32 scores
C.B^T (query.key) times L; each row divided by max(|row sum|, 1), a row sum under 1e-6 in
magnitude first replaced by 1; cast to the input dtype and multiplied by x (value).
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "mamba2_2_7b_ssd",
    "model": "Mamba-2-2.7B",
    "operator": "state_space_duality",
    "batch": 4,
    "seq_len": 4096,
    "num_heads": 64,
    "head_dim": 64,
    "d_state": 128,
    "d_model": 2560,
}


def create_inputs(dtype=jnp.bfloat16):
    shape = (CONFIG["batch"], CONFIG["num_heads"], CONFIG["seq_len"], CONFIG["head_dim"])
    k_c, k_b, k_x, k_a, _ = jax.random.split(jax.random.PRNGKey(42), 5)
    c_proj, b_proj, x_seq = (jax.random.normal(k, shape, dtype=dtype) for k in (k_c, k_b, k_x))
    a_log = jax.random.normal(k_a, shape[:3], dtype=jnp.float32) * 0.5 - 4.0
    return c_proj, b_proj, x_seq, a_log


def workload(query, key, value, A_log):
    length = query.shape[2]

    # cumulative log-decay along the sequence
    keep = jax.nn.sigmoid(A_log.astype(jnp.float32))
    log_keep = jnp.log(keep + 1e-8)
    running = jnp.cumsum(log_keep, axis=-1)

    # L[i, j] = exp(running_i - running_j) on and below the diagonal, 0 above it
    gap = running[:, :, :, None] - running[:, :, None, :]
    below = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    seg_decay = jnp.exp(jnp.where(below[None, None, :, :], gap, -1e30))

    mixed = jnp.einsum("bhqd,bhkd->bhqk", query.astype(jnp.float32), key.astype(jnp.float32))
    mixed = mixed * seg_decay

    # signed row sums: near-zero ones become 1, and no row is scaled up
    totals = jnp.sum(mixed, axis=-1, keepdims=True)
    totals = jnp.where(jnp.abs(totals) < 1e-6, 1.0, totals)
    mixed = mixed / jnp.maximum(jnp.abs(totals), 1.0)

    return jnp.einsum("bhqk,bhkd->bhqd", mixed.astype(query.dtype), value)
