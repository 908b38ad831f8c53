"""Mean cross-entropy of a fused LM-head projection as a Pallas TPU kernel.

The logits hidden @ weight never reach HBM. Grid (token blocks, vocab blocks): a token
block's hidden rows, whole (every hidden column), stay in VMEM while the vocab blocks of
the weight stream past them; each step's (token, vocab) tile of f32 logits is folded into
a running row max m and row sum l of exp (an online logsumexp over the vocabulary, f32
scratch), and the label's logit is picked out of the tile that holds the label's column.
After the last vocab block each token's loss logsumexp - logit[label] is written, and the
wrapper takes the mean. The
vocabulary (128256 = 2^7 * 1002) need not be a multiple of block_v: columns of the last
vocab block past the vocabulary read unspecified data and are masked to -inf.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"block_t": 512, "block_v": 512, "buffers": 2}
VMEM_LIMIT = 100 * 2**20  # above the 32 MiB default, so wide vocab blocks fit; v6e has 128 MiB


def cross_entropy_kernel(hidden_ref, weight_ref, labels_ref, loss_ref, m_ref, l_ref, picked_ref, *, vocab):
    j = pl.program_id(1)
    block_v = weight_ref.shape[1]

    @pl.when(j == 0)
    def _init_row_stats():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        picked_ref[...] = jnp.zeros_like(picked_ref)

    logits = jnp.dot(hidden_ref[...], weight_ref[...], preferred_element_type=jnp.float32)
    cols = j * block_v + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    if vocab % block_v:
        logits = jnp.where(cols < vocab, logits, -jnp.inf)
    m_prev = m_ref[...]  # (block_t, 128): every lane holds the row's value
    m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
    l_ref[...] = jnp.exp(m_prev - m_next) * l_ref[...] + jnp.sum(
        jnp.exp(logits - m_next[:, :1]), axis=1, keepdims=True)
    m_ref[...] = m_next
    picked_ref[...] += jnp.sum(jnp.where(cols == labels_ref[...], logits, 0.0), axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _store_loss():
        loss = m_ref[...] + jnp.log(l_ref[...]) - picked_ref[...]
        loss_ref[...] = loss[:, :1]


@functools.partial(jax.jit, static_argnames=("bt", "bv", "buffers"))
def token_losses(hidden, weight, labels, *, bt, bv, buffers):
    tokens, hidden_dim = hidden.shape
    vocab = weight.shape[1]
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    return pl.pallas_call(
        functools.partial(cross_entropy_kernel, vocab=vocab),
        grid=(tokens // bt, pl.cdiv(vocab, bv)),
        in_specs=[
            # Fixed across the vocab axis: fetched once per token block.
            pl.BlockSpec((bt, hidden_dim), lambda i, j: (i, 0), **pipeline),
            pl.BlockSpec((hidden_dim, bv), lambda i, j: (0, j), **pipeline),
            pl.BlockSpec((bt, 1), lambda i, j: (i, 0)),
        ],
        out_specs=pl.BlockSpec((bt, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((tokens, 1), jnp.float32),
        scratch_shapes=[
            pltpu.VMEM((bt, 128), jnp.float32),  # m: running row max
            pltpu.VMEM((bt, 128), jnp.float32),  # l: running row sum of exp(logit - m)
            pltpu.VMEM((bt, 128), jnp.float32),  # the label's logit
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(hidden, weight, labels.reshape(tokens, 1).astype(jnp.int32))


def workload(hidden, weight, labels):
    s = SCHEDULE
    losses = token_losses(hidden, weight, labels, bt=s["block_t"], bv=s["block_v"], buffers=s["buffers"])
    return jnp.mean(losses)
