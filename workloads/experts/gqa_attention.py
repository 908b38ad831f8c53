"""Expert for 2p gqa_attention: jax's shipped splash attention with JAXBench's tuned blocks.

Kernel: ``jax.experimental.pallas.ops.tpu.splash_attention`` (``make_splash_mha_single_device``:
head_shards=1, q_seq_shards=1, is_mqa=False) with a ``CausalMask((S, S))`` repeated over the
query heads in a ``MultiHeadMask``, and ``BlockSizes(block_q=2048, block_kv=2048,
block_kv_compute=1024)`` with HEAD_DIM_MINOR q/k/v layouts and no backward blocks, as in
JAXBench's optimized.py (workloads.md section 4).

Adapted: splash takes one batch element in BHSD, so the BSHD inputs are transposed in and
the output back, and q is multiplied by head_dim^-0.5 beforehand (splash applies no scale).
JAXBench's expert ``jnp.repeat``-s KV to all 128 heads; here KV keeps its 8 heads, since
splash's MHA path already maps query head h to KV head h // (Hq/Hkv) (the same math, with
no repeated copy of K and V in HBM). The batch is walked with ``lax.map`` rather than
``vmap``: jax's TPU interpreter cannot run splash vmapped over a batch.
"""

import jax
from jax.experimental.pallas.ops.tpu import splash_attention as splash

BLOCK_SIZES = splash.BlockSizes(
    block_q=2048, block_kv=2048, block_kv_compute=1024,
    q_layout=splash.QKVLayout.HEAD_DIM_MINOR,
    k_layout=splash.QKVLayout.HEAD_DIM_MINOR,
    v_layout=splash.QKVLayout.HEAD_DIM_MINOR,
)


def workload(query, key, value):
    _, seq, q_heads, head_dim = query.shape
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(q_heads)])
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=BLOCK_SIZES)
    q = (query * head_dim**-0.5).transpose(0, 2, 1, 3)
    k, v = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)
    out = jax.lax.map(lambda qkv: kernel(*qkv), (q, k, v))
    return out.transpose(0, 2, 1, 3).astype(query.dtype)
