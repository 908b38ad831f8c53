"""10p mixtral_moe: mirrors JAXBench's formulation of 10p (Mixtral-8x7B sparse MoE layer).

A router picks each token's top-k experts and softmaxes their logits; every expert's
SwiGLU MLP then runs on every token (batched einsums over the expert axis), and the
outputs are mixed with per-expert weights built from an f32 one-hot of the choices, so
the result is f32.
"""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "mixtral_8x7b_moe",
    "model": "Mixtral-8x7B",
    "operator": "sparse_moe",
    "batch": 2,
    "seq_len": 4096,
    "emb_dim": 4096,
    "mlp_dim": 14336,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}


def create_inputs(dtype=jnp.bfloat16):
    b, s, d, f, e = (CONFIG[k] for k in ("batch", "seq_len", "emb_dim", "mlp_dim", "num_experts"))
    k_x, k_router, k_gate, k_up, k_down = jax.random.split(jax.random.PRNGKey(42), 5)
    shapes = ((k_router, (d, e)), (k_gate, (e, d, f)), (k_up, (e, d, f)), (k_down, (e, f, d)))
    tokens = jax.random.normal(k_x, (b, s, d), dtype=dtype)
    router, gate, up, down = (jax.random.normal(k, shape, dtype=dtype) * 0.02 for k, shape in shapes)
    return tokens, router, gate, up, down


def workload(x, router_weights, expert_gate_kernels, expert_up_kernels, expert_down_kernels):
    n_experts = router_weights.shape[-1]
    top_k = CONFIG["num_experts_per_tok"]

    # which experts each token uses, and how much
    route_logits = jnp.dot(x, router_weights)
    chosen_logits, chosen = jax.lax.top_k(route_logits, top_k)
    chosen_probs = jax.nn.softmax(chosen_logits, axis=-1)

    # all experts on all tokens: (batch, seq, expert, ...)
    gated = jax.nn.silu(jnp.einsum("btd,xdf->btxf", x, expert_gate_kernels))
    lifted = jnp.einsum("btd,xdf->btxf", x, expert_up_kernels)
    per_expert = jnp.einsum("btxf,xfd->btxd", gated * lifted, expert_down_kernels)

    # dense mixing weights: zero for the experts a token did not choose
    selection = jax.nn.one_hot(chosen, n_experts)
    mix = (selection * chosen_probs[..., None]).sum(axis=2)
    return jnp.einsum("btxd,btx->btd", per_expert, mix)
