"""Expert for 11p megablox_gmm: jax's shipped megablox grouped matmul with JAXBench's tuning.

Kernel: ``jax.experimental.pallas.ops.tpu.megablox.gmm`` with ``tiling=(tm, tk, tn) =
(256, 1024, 1024)``, JAXBench's TUNED_PARAMS for 11p (its optimized.py), on the same
(lhs, rhs, group_sizes) inputs. Adapted in two ways:

* ``preferred_element_type`` is the input dtype (bf16) rather than megablox's default f32,
  so the output dtype matches the reference's bf16 (the kernel still accumulates in f32
  and casts once per tile).
* megablox assumes the group sizes add up to M and leaves the rows past their total
  unwritten (garbage; NaN in interpret mode). The general rule makes those rows zero, so
  the expert zeroes them after the call: one elementwise pass over the output.

N = 1536 is not a multiple of tn = 1024; megablox handles the partial last column tile.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm

TILING = (256, 1024, 1024)


def workload(lhs, rhs, group_sizes):
    out = gmm(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=TILING)
    row = jax.lax.broadcasted_iota(jnp.int32, out.shape, 0)
    return jnp.where(row < jnp.sum(group_sizes), out, jnp.zeros_like(out))
