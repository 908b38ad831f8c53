"""13p cross_entropy: mirrors JAXBench's formulation of 13p (Llama-3.1-8B LM head + loss).

Projects the hidden states onto the vocabulary, takes log-softmax over it, picks each
token's label log-probability with an f32 one-hot and returns the mean negative value.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "llama3_8b_cross_entropy",
    "model": "Llama-3.1-8B",
    "operator": "fused_cross_entropy",
    "batch_tokens": 8192,
    "hidden_dim": 4096,
    "vocab_size": 128256,
}


def create_inputs(dtype=jnp.bfloat16):
    tokens, width, vocab = CONFIG["batch_tokens"], CONFIG["hidden_dim"], CONFIG["vocab_size"]
    k_h, k_w, k_y = jax.random.split(jax.random.PRNGKey(42), 3)
    states = jax.random.normal(k_h, (tokens, width), dtype=dtype)
    lm_head = 0.02 * jax.random.normal(k_w, (width, vocab), dtype=dtype)
    targets = jax.random.randint(k_y, (tokens,), 0, vocab)
    return states, lm_head, targets


def workload(hidden, weight, labels):
    scores = jnp.dot(hidden, weight)
    log_p = jax.nn.log_softmax(scores, axis=-1)
    target_mask = jax.nn.one_hot(labels, scores.shape[-1])
    per_token = -jnp.sum(target_mask * log_p, axis=-1)
    return jnp.mean(per_token)
