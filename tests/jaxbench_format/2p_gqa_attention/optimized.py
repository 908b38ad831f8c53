"""2p gqa_attention, optimized: mirrors JAXBench's expert file for 2p.

Splash attention as shipped in jax (the multi-head kernel, one shard of heads and of
query rows) with a causal mask for every query head and JAXBench's v6e-tuned blocks:
2048 query rows and 2048 key rows per grid step, keys computed 1024 at a time, head-dim-
minor layouts, no backward blocks. Glue as in JAXBench: BSHD -> BHSD, q multiplied by
head_dim^-0.5 (splash applies no scale), each batch element's KV heads repeated to the
query-head count, the kernel vmapped over the batch, and the result moved back to BSHD.
"""
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

CONFIG = {
    "name": "llama3_405b_gqa_optimized",
    "model": "Llama-3.1-405B",
    "operator": "gqa_attention",
    "batch": 4,
    "seq_len": 4096,
    "num_query_heads": 128,
    "num_kv_heads": 8,
    "head_dim": 128,
    "emb_dim": 16384,
}

# v6e-tuned for 128 query heads over 8 KV heads; layouts 1 = HEAD_DIM_MINOR.
TUNED_PARAMS = {
    "block_q": 2048,
    "block_kv": 2048,
    "block_kv_compute": 1024,
    "q_layout": 1,
    "k_layout": 1,
    "v_layout": 1,
    "head_shards": 1,
    "q_seq_shards": 1,
    "block_q_dkv": None,
    "block_kv_dkv": None,
    "block_kv_dkv_compute": None,
    "block_q_dq": None,
    "block_kv_dq": None,
}


def create_inputs(dtype=jnp.bfloat16):
    k_q, k_k, k_v = jax.random.split(jax.random.PRNGKey(42), 3)
    rows, length, width = CONFIG["batch"], CONFIG["seq_len"], CONFIG["head_dim"]
    q_shape = (rows, length, CONFIG["num_query_heads"], width)
    kv_shape = (rows, length, CONFIG["num_kv_heads"], width)
    return (jax.random.normal(k_q, q_shape, dtype=dtype),
            jax.random.normal(k_k, kv_shape, dtype=dtype),
            jax.random.normal(k_v, kv_shape, dtype=dtype))


def _tiles():
    p = dict(TUNED_PARAMS)
    layouts = {name: splash.QKVLayout(p.pop(name)) for name in ("q_layout", "k_layout", "v_layout")}
    p.pop("head_shards"), p.pop("q_seq_shards")
    return splash.BlockSizes(**p, **layouts)


def workload(query, key, value):
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (query, key, value))  # BHSD
    _, q_heads, length, width = q.shape
    q = q * (width**-0.5)
    group = q_heads // v.shape[1]
    causal = masks.MultiHeadMask([masks.CausalMask(shape=(length, length))] * q_heads)
    kernel = splash._make_splash_attention(
        causal, block_sizes=_tiles(), is_mqa=False,
        head_shards=TUNED_PARAMS["head_shards"], q_seq_shards=TUNED_PARAMS["q_seq_shards"],
    )

    def per_example(q_ex, k_ex, v_ex):
        return kernel(q_ex, jnp.repeat(k_ex, group, axis=0), jnp.repeat(v_ex, group, axis=0))

    return jax.vmap(per_example)(q, k, v).transpose(0, 2, 1, 3)
