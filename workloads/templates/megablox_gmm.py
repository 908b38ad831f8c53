"""Grouped matmul out[rows of g] = lhs[rows of g] @ rhs[g] as a Pallas TPU kernel.

Group g owns the rows [offset_g, offset_g + size_g), offsets being the exclusive cumulative
sum of group_sizes; rows past the groups' total are zero. The groups are data, so the row
tiles they touch are only known at run time: the wrapper turns group_sizes into a schedule
of work items (row tile, group), one per tile a group touches, in row order, and hands it
to the kernel by scalar prefetch. The index maps read it to fetch each item's lhs tile and
its group's rhs block. Rows past the total form one more pseudo-group whose items only
write zeros, so every row of every tile is written by exactly one item. A tile that spans
a group boundary is visited once per group, consecutively; each visit stores only its own
group's rows, and the output block stays in VMEM between the visits. The grid has a fixed
number of item slots (row tiles + groups, the most any sizes can need); slots past the
schedule's end do no work and keep their predecessor's blocks, so they cost no DMA.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCHEDULE = {"tm": 256, "tk": 1024, "tn": 768, "buffers": 2}


def work_items(group_sizes, m, tm):
    """(item_group, item_tile, offsets, num_items) for row tiles of ``tm`` rows.

    Group index G (one past the last) is the pseudo-group of rows past the total.
    ``offsets`` has G + 2 entries: group g spans rows [offsets[g], offsets[g + 1]).
    """
    num_groups = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    sizes = jnp.concatenate([sizes, (m - jnp.sum(sizes))[None]])
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    first_tile = starts // tm
    visits = jnp.where(sizes > 0, (ends - 1) // tm - first_tile + 1, 0)
    visits_end = jnp.cumsum(visits)
    num_items = visits_end[-1]
    # A group's tiles overlap the previous group's last tile at most once, so the
    # schedule never needs more than tiles_m + (G + 1) - 1 items.
    slots = jnp.minimum(jnp.arange(m // tm + num_groups, dtype=jnp.int32), num_items - 1)
    item_group = jnp.searchsorted(visits_end, slots, side="right").astype(jnp.int32)
    item_tile = first_tile[item_group] + slots - (visits_end - visits)[item_group]
    return item_group, item_tile.astype(jnp.int32), offsets, num_items[None].astype(jnp.int32)


def gmm_kernel(group_ref, tile_ref, offsets_ref, num_items_ref, lhs_ref, rhs_ref, out_ref, acc_ref, *, num_groups):
    item, k = pl.program_id(1), pl.program_id(2)
    group = group_ref[item]
    live = item < num_items_ref[0]

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # The pseudo-group of rows past the total multiplies nothing: its acc stays zero.
    @pl.when(live & (group < num_groups))
    def _accumulate():
        acc_ref[...] += jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)

    @pl.when(live & (k == pl.num_programs(2) - 1))
    def _store():
        tm = acc_ref.shape[0]
        rows = tile_ref[item] * tm + jax.lax.broadcasted_iota(jnp.int32, acc_ref.shape, 0)
        mine = (rows >= offsets_ref[group]) & (rows < offsets_ref[group + 1])
        out_ref[...] = jnp.where(mine, acc_ref[...].astype(out_ref.dtype), out_ref[...])


@functools.partial(jax.jit, static_argnames=("tm", "tk", "tn", "buffers"))
def gmm(lhs, rhs, group_sizes, *, tm, tk, tn, buffers):
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    schedule = work_items(group_sizes, m, tm)
    tiles_k = k // tk

    def k_of(item, kk, num_items_ref):
        # Idle slots hold the last k block: the block already in VMEM, so no new DMA.
        return jnp.where(item < num_items_ref[0], kk, tiles_k - 1)

    def lhs_map(j, item, kk, group_ref, tile_ref, offsets_ref, num_items_ref):
        return tile_ref[item], k_of(item, kk, num_items_ref)

    def rhs_map(j, item, kk, group_ref, tile_ref, offsets_ref, num_items_ref):
        return jnp.minimum(group_ref[item], num_groups - 1), k_of(item, kk, num_items_ref), j

    def out_map(j, item, kk, group_ref, tile_ref, offsets_ref, num_items_ref):
        return tile_ref[item], j

    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(n // tn, m // tm + num_groups, tiles_k),
        in_specs=[
            pl.BlockSpec((tm, tk), lhs_map, **pipeline),
            pl.BlockSpec((pl.Squeezed(), tk, tn), rhs_map, **pipeline),
        ],
        out_specs=pl.BlockSpec((tm, tn), out_map),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
    )
    return pl.pallas_call(
        functools.partial(gmm_kernel, num_groups=num_groups),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        # Items revisit an output tile consecutively, so the item axis runs in order.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    )(*schedule, lhs, rhs)


def workload(lhs, rhs, group_sizes):
    s = SCHEDULE
    return gmm(lhs, rhs, group_sizes, tm=s["tm"], tk=s["tk"], tn=s["tn"], buffers=s["buffers"])
