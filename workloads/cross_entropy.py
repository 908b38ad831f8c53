"""13p cross_entropy: the Llama-3.1-8B fused LM-head projection and mean cross-entropy (tokamax).

Inputs (spec 13p): ``split(key(42), 3)`` -> hidden (batch_tokens, hidden_dim) ~ N(0,1) and
weight (hidden_dim, vocab_size) ~ N(0,1)*0.02, bf16 (keys 1 and 2, exactly as the spec);
labels (batch_tokens,) int32 from key 3 (see the input fix below). Math: logits =
hidden @ weight (bf16); log_probs = log_softmax over the vocabulary (bf16); per-token
loss = -sum(one_hot(label, f32) * log_probs); output the mean over tokens, a () f32
scalar. Tolerance 1e-2/1e-2: about +-0.1 on a loss near 10.

Input fix (labels only; math, shapes and dtypes unchanged): JAXBench draws the labels
uniformly at random, independent of the logits, so the label term is pure noise: the mean
over tokens of logit[label] is ~N(0, sigma^2/tokens) ~ 0.014 at full size, and a kernel
that drops the label gather altogether (mean logsumexp) lands within 0.02 of the right
loss, well inside the ~0.13 tolerance. At seed 0 each token's label is drawn from the
model's own softmax (``jax.random.categorical`` on that token's logits, 128 tokens per key
``split(key 3, batch_tokens // 128)``), as a calibrated model's data would be. Then
E[logit[label]] ~ sigma^2 (the logits' variance, 1.64 at full size and 0.41 at check
size), so the loss sits near ln(V) - sigma^2/2 and dropping the label term, or answering
ln(V), misses by sigma^2 or sigma^2/2: 4.5x and 2.2x the tolerance at check size (0.41 and
0.20 against 0.092), ~14x and ~7x at full size. But that loss is then a function of the
inputs' moments (ln V - sigma^2/2, sigma^2 from the norms of hidden and weight), which
a kernel can return without the projection.

The check's seeds (never 0) draw the labels uniformly over the vocabulary and move each
hidden row along its label's weight column so that its label logit rises by U[0, 1.5 ln V]
(``LABEL_BOOST``), as a trained model's hidden states point at their next token: the loss
falls to ~3.1-3.6 at check size, the label is the argmax for ~55-80% of the tokens, and
the moments' answer, ln(V), the mean logsumexp without the label term and the max logit in
place of the label's all miss by 7x to 150x the tolerance. hidden is otherwise structured
(per-token and per-feature means and scales, correlated tokens, outliers) and the weight has
scales, low rank and outliers but no means (``WEIGHT_STRUCTURE``). A scalar output cannot
reject a constant that happens to equal the loss; the check seeds' losses differ by up to
~0.5, over 10x the tolerance.

The template keeps a token block's whole hidden rows in VMEM, so hidden_dim is not tiled;
the VMEM rule rejects blocks whose (block_t, hidden_dim) and (hidden_dim, block_v) tiles
do not fit. The check runs at batch_tokens=1024, hidden_dim=1024, vocab_size=4352
(17 * 256): tokens are a multiple of the largest block_t (1024), and the vocabulary is,
like the full size's 128256, a multiple of 256 but of no larger block, so vocab blocks of
512 and more end in a partial, masked block at both sizes. hidden_dim shrinks 4x (the
logits' sigma^2 with it: see the input fix), to keep three seeds' projections cheap.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .base import (
    WEIGHT_STRUCTURE,
    Knob,
    ScheduleSpace,
    Workload,
    indivisible,
    over_vmem,
    require_positive_ints,
    seeded_normal,
    tile_bytes,
)

BLOCK_T = (128, 256, 512, 1024)
BLOCK_V = (128, 256, 512, 1024, 2048)
VMEM_LIMIT = 100 * 2**20  # the template's scoped VMEM limit (templates/cross_entropy.py)
LABEL_CHUNK = 128  # tokens whose labels are sampled per key (bounds the sampling's memory)
LABEL_BOOST = 1.5  # at seeds other than 0, label logits are raised by up to this many ln(vocab_size)


def cross_entropy_vmem_bytes(bt: int, bv: int, hidden_dim: int, buffers: int, dt: str) -> int:
    """The template's VMEM: pipelined (block_t, hidden_dim) hidden and (hidden_dim, block_v)
    weight blocks, the labels and loss blocks, 3 f32 (block_t, block_v) tiles (the logits,
    their exp and the label mask's select) and the row statistics. Checked on the v6e
    compiler at full size, under the default 32 MiB scoped limit: block_t=1024, block_v=512
    needs 34.5 MiB (estimated 33.5); block_t=512, block_v=1024 (estimated 31.5 MiB) fits. The
    template asks for 100 MiB."""
    return (buffers * (tile_bytes((bt, hidden_dim), dt) + tile_bytes((hidden_dim, bv), dt))
            + 2 * tile_bytes((bt, 1), "int32") + 2 * tile_bytes((bt, 1), "float32")
            + 3 * tile_bytes((bt, bv), "float32") + 3 * tile_bytes((bt, 128), "float32"))


class CrossEntropy(Workload):
    name = "cross_entropy"
    jaxbench_id = "13p"
    category = "matmul+loss"
    description = "mean cross-entropy of hidden (8192,4096) @ weight (4096,128256), bf16 -> f32 scalar"
    defaults = {"batch_tokens": 8192, "hidden_dim": 4096, "vocab_size": 128256, "dtype": "bfloat16"}
    check_overrides = {"batch_tokens": 1024, "hidden_dim": 1024, "vocab_size": 4352}
    atol = 1e-2
    rtol = 1e-2
    template_file = "cross_entropy.py"

    def validate_config(self, config):
        require_positive_ints(self.name, config, ("batch_tokens", "hidden_dim", "vocab_size"))
        for key in ("batch_tokens", "hidden_dim", "vocab_size"):
            if config[key] % 128:
                raise ValueError(f"cross_entropy: {key}={config[key]} must be a multiple of 128")

    def make_inputs(self, config, seed):
        dt = self.dtype(config)
        b, h, v = config["batch_tokens"], config["hidden_dim"], config["vocab_size"]
        k_hidden, k_weight, k_labels = jax.random.split(jax.random.key(42 + seed), 3)
        hidden = seeded_normal(k_hidden, (b, h), dt, seed)
        weight = seeded_normal(k_weight, (h, v), dt, seed, scale=0.02, **WEIGHT_STRUCTURE)
        if seed:  # uniform labels; each hidden row moved to raise its label's logit by U[0, 1.5 ln V]
            k_pick, k_boost = jax.random.split(k_labels)
            labels = jax.random.randint(k_pick, (b,), 0, v, jnp.int32)
            column = weight.T[labels].astype(jnp.float32)  # (b, h)
            boost = jax.random.uniform(k_boost, (b, 1), jnp.float32, 0.0, LABEL_BOOST * math.log(v))
            hidden = (hidden + boost * column / jnp.sum(column * column, axis=1, keepdims=True)).astype(dt)
            return hidden, weight, labels

        def sample(chunk):
            rows, key = chunk
            return jax.random.categorical(key, jnp.dot(rows, weight).astype(jnp.float32), axis=-1)

        chunks = (hidden.reshape(b // LABEL_CHUNK, LABEL_CHUNK, h), jax.random.split(k_labels, b // LABEL_CHUNK))
        labels = jax.lax.map(sample, chunks).reshape(b).astype(jnp.int32)
        return hidden, weight, labels

    def reference(self, config, hidden, weight, labels):
        logits = jnp.dot(hidden, weight)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        one_hot = jax.nn.one_hot(labels, weight.shape[1], dtype=jnp.float32)
        return jnp.mean(-jnp.sum(one_hot * log_probs, axis=-1))

    def _schedule_space(self, config):
        dt = str(jnp.dtype(config["dtype"]))
        dims = {"block_t": ("batch_tokens", config["batch_tokens"])}

        def check(s):
            # block_v need not divide vocab_size: the last vocab block is masked.
            return indivisible(dims, s) or over_vmem(
                cross_entropy_vmem_bytes(s["block_t"], s["block_v"], config["hidden_dim"], s["buffers"], dt),
                VMEM_LIMIT)

        return ScheduleSpace(
            [
                Knob("block_t", BLOCK_T, 512, "tokens per grid step (the weight streams once per token block)"),
                Knob("block_v", BLOCK_V, 512, "vocabulary columns per grid step (the online logsumexp's block)"),
                Knob("buffers", (1, 2), 2, "pipeline buffers for the hidden and weight blocks (jax 0.10.2 lowers only 1 or 2)"),
            ],
            check,
        )
