"""Expert for 8p gemm: jax's Pallas TPU matmul with JAXBench's v6e-tuned blocks.

Kernel: ``jax.experimental.pallas.ops.tpu.matmul.matmul`` (the Pallas TPU matmul guide's
kernel: grid (M/bm, N/bn, K/bk), semantics (parallel, parallel, arbitrary), an f32 VMEM
accumulator). Tuned parameters (workloads.md section 4): block_shape (bm, bn) = (1024, 2048),
block_k = 1024; at full size the grid is (8, 14, 8). Output bf16 like the reference.
The inputs are the workload's own (A (M, K), B (K, N)). At a config smaller than a tuned
block, that block shrinks to the dimension (jax's kernel would otherwise run a grid of zero
steps and return an unwritten output); at the full size the tuned blocks are used as they are.
"""

from jax.experimental.pallas.ops.tpu.matmul import matmul

BLOCK_SHAPE = (1024, 2048)  # (bm, bn)
BLOCK_K = 1024


def workload(A, B):
    (m, k), n = A.shape, B.shape[1]
    return matmul(A, B, block_shape=(min(BLOCK_SHAPE[0], m), min(BLOCK_SHAPE[1], n)), block_k=min(BLOCK_K, k))
