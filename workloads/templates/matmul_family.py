"""A tiled matmul with the workload's epilogue fused into it, as a Pallas TPU kernel.

x (M, K) @ w (K, N), or x @ w.T for a w stored (N, K), accumulates over K blocks in an f32
VMEM scratch. On the last K step the workload's ``epilogue`` maps the f32 tile, and the
matching blocks of its extra operands, to the output block, so the activation, norm or
reduction never makes a round trip through HBM. Without ``block_n`` the kernel keeps
whole rows (block_n = N), which softmax, row reductions and norms over features need.

The workload's own part follows the family code below: its SCHEDULE, its epilogue and
its ``workload(*inputs)`` glue.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The scoped VMEM every kernel here may use: above the 32 MiB default so whole rows fit;
# v6e has 128 MiB.
VMEM_LIMIT = 100 * 2**20


def matmul_tile(x_ref, w_ref, acc_ref, transpose_w):
    """The f32 tile x @ w (or x @ w.T), as a function to call once it is complete (at the
    last K step, grid axis 2). With K in one step (``acc_ref`` None) it is this step's dot,
    written out without a round trip through VMEM; else the dots accumulate in ``acc_ref``."""
    contract = ((1,), (1,)) if transpose_w else ((1,), (0,))

    def dot():
        return jax.lax.dot_general(x_ref[...], w_ref[...], (contract, ((), ())), preferred_element_type=jnp.float32)

    if acc_ref is None:
        return dot

    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += dot()
    return lambda: acc_ref[...]


def fused_matmul_kernel(x_ref, w_ref, *refs, epilogue, transpose_w, n_operands, single_k):
    operand_refs, o_ref = refs[:n_operands], refs[n_operands]
    tile = matmul_tile(x_ref, w_ref, None if single_k else refs[-1], transpose_w)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = epilogue(tile(), *(r[...] for r in operand_refs)).astype(o_ref.dtype)


def row_reduce_kernel(x_ref, w_ref, *refs, epilogue, combine, finish, transpose_w, n_operands, single_k,
                      keep=None):
    """fused_matmul_kernel over tiles of a row: at each tile's last K step the epilogue maps
    it to per-row carries (a tuple of (bm, 1) arrays), merged with ``combine`` across the
    row's N tiles; the last tile writes ``finish(carries)``. With ``keep`` the epilogue
    returns (tile, carries) and every tile is written out, as ``keep(tile, *carries so far)``,
    with the carries so far (the row's, at its last tile)."""
    n_out = 1 if keep is None else 2
    operand_refs, out_refs = refs[:n_operands], refs[n_operands:n_operands + n_out]
    carry_ref = refs[n_operands + n_out]
    j, k = pl.program_id(1), pl.program_id(2)
    tile = matmul_tile(x_ref, w_ref, None if single_k else refs[-1], transpose_w)

    def carries():
        return tuple(carry_ref[c][:, :1] for c in range(carry_ref.shape[0]))

    def store(values):
        for c, v in enumerate(values):
            carry_ref[c] = jnp.broadcast_to(v, carry_ref.shape[1:])

    @pl.when(k == pl.num_programs(2) - 1)
    def _tile_done():
        part = epilogue(tile(), *(r[...] for r in operand_refs))
        if keep is not None:
            v, part = part
        pl.when(j == 0)(lambda: store(part))
        pl.when(j > 0)(lambda: store(combine(carries(), part)))
        if keep is not None:
            so_far = carries()
            out_refs[0][...] = keep(v, *so_far).astype(out_refs[0].dtype)
            for c, value in enumerate(so_far):
                out_refs[1][0, c] = value
        else:
            @pl.when(j == pl.num_programs(1) - 1)
            def _row_done():
                out_refs[0][...] = finish(carries()).astype(out_refs[0].dtype)


def accumulator(bm, bn, single_k):
    """The f32 accumulator's scratch, last among a kernel's scratch refs: none when K is one block."""
    return [] if single_k else [pltpu.VMEM((bm, bn), jnp.float32)]


def x_panel_copy(x_hbm, x_buf, sem, panel, chunk, chunks):
    """The copy of chunk ``chunk`` (of ``chunks``) of x's row panel ``panel`` into its slot of
    ``x_buf`` (2, bm, K)."""
    bm = x_buf.shape[1]
    rows, slot = bm // chunks, panel % 2
    return pltpu.make_async_copy(x_hbm.at[pl.ds(panel * bm + chunk * rows, rows)],
                                 x_buf.at[slot, pl.ds(chunk * rows, rows)], sem.at[slot])


def x_ahead_kernel(x_hbm, *refs, kernel, chunks):
    """``kernel`` with x's (bm, K) row panel copied by hand a panel ahead: during the steps of
    panel i, chunk j of panel i + 1 starts at column step j, so the panel change waits for
    nothing (the pipeline fetches a new panel during the one step before it). The first
    panel has nothing to hide behind and is waited for at once, as the pipeline's first
    blocks are. Needs the grid to run in order (no parallel axes) and all of K in one step."""
    *refs, x_buf, sem = refs
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when((i == 0) & (j == 0))
    def _first_panel():
        first = pltpu.make_async_copy(x_hbm.at[pl.ds(0, x_buf.shape[1])], x_buf.at[0], sem.at[0])
        first.start()
        first.wait()

    @pl.when((i > 0) & (j == 0))
    def _panel_arrived():
        @pl.loop(0, chunks)
        def _(c):
            x_panel_copy(x_hbm, x_buf, sem, i, c, chunks).wait()

    @pl.when((i + 1 < pl.num_programs(0)) & (j < chunks))
    def _next_panel():
        x_panel_copy(x_hbm, x_buf, sem, i + 1, j, chunks).start()

    kernel(x_buf.at[i % 2], *refs)


def x_input(kernel, x, bm, bk, n_tiles, buffers, x_panel, semantics):
    """(kernel, x's BlockSpec, extra scratch, dimension semantics) for x read in (bm, bk)
    blocks by the pipeline (``x_panel`` 'pipelined'), or in (bm, K) panels a panel ahead by
    ``x_ahead_kernel`` ('prefetched', all of K in one step: bk = K)."""
    if x_panel == "pipelined":
        return kernel, pl.BlockSpec((bm, bk), lambda i, j, k: (i, k), **pipelined(buffers)), [], semantics
    assert x_panel == "prefetched" and bk == x.shape[1], "a prefetched x panel needs all of K in one step"
    chunks = n_tiles  # one chunk per column step, each at least 16 rows (a bf16 sublane tile)
    while chunks > 1 and (bm % chunks or bm // chunks % 16):
        chunks -= 1
    scratch = [pltpu.VMEM((2, bm, bk), x.dtype), pltpu.SemaphoreType.DMA((2,))]
    return (functools.partial(x_ahead_kernel, kernel=kernel, chunks=chunks), pl.BlockSpec(memory_space=pl.ANY),
            scratch, ("arbitrary",) * len(semantics))


def pipelined(buffers):
    """BlockSpec options for a streamed operand with ``buffers`` pipeline buffers (2 is Pallas's default)."""
    return {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}


def w_spec(bk, bn, transpose_w, buffers):
    """w's blocks for the (i, j, k) grid: (bk, bn) of w (K, N), or (bn, bk) of w stored (N, K)."""
    if transpose_w:
        return pl.BlockSpec((bn, bk), lambda i, j, k: (j, k), **pipelined(buffers))
    return pl.BlockSpec((bk, bn), lambda i, j, k: (k, j), **pipelined(buffers))


def _operand_spec(shape, bm, bn):
    """Operands are per-column vectors (1, N), full tiles (M, N) or scalars (1, 1)."""
    if shape[0] == 1:
        return pl.BlockSpec((1, bn if shape[1] > 1 else 1), lambda i, j, k: (0, j if shape[1] > 1 else 0))
    return pl.BlockSpec((bm, bn), lambda i, j, k: (i, j))


@functools.partial(jax.jit, static_argnames=("epilogue", "transpose_w", "out_cols", "reduction", "bm", "bk",
                                             "bn", "buffers", "x_panel"))
def fused_matmul(x, w, operands=(), *, epilogue, transpose_w=False, out_cols=None, reduction=None, bm, bk,
                 bn=None, buffers=2, x_panel="pipelined"):
    """epilogue(x @ w) over (bm, bn) tiles. ``out_cols`` set: the epilogue reduces whole
    rows to ``out_cols`` columns (needs bn = N), unless a ``reduction`` says how: then the
    epilogue maps each (bm, bn) tile to per-row carries and ``reduction`` is
    (combine, finish, number of carries), see ``row_reduce_kernel``. ``bk`` None: the
    whole contraction in one grid step, with no accumulator. ``x_panel``: see ``x_input``."""
    m, kdim = x.shape
    n = w.shape[0] if transpose_w else w.shape[1]
    # bk None (the accumulator knob, never the sizes, decides): all of K in one step.
    single_k, bn, bk = bk is None, bn or n, bk or kdim
    if reduction is not None:
        combine, finish, n_carries = reduction
        if bn == n:  # one tile per row: its carries are the row's
            return fused_matmul(x, w, operands, epilogue=lambda *a: finish(epilogue(*a)), transpose_w=transpose_w,
                                out_cols=out_cols, bm=bm, bk=None if single_k else bk, bn=bn, buffers=buffers,
                                x_panel=x_panel)
        return _row_reduce(x, w, operands, epilogue, combine, finish, n_carries, transpose_w, out_cols, bm, bk, bn,
                           buffers, single_k, x_panel=x_panel)
    if out_cols is None:
        out_spec, out_shape = pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)), (m, n)
    else:
        assert bn == n, "a row-reducing epilogue needs whole rows"
        out_spec, out_shape = pl.BlockSpec((bm, out_cols), lambda i, j, k: (i, 0)), (m, out_cols)
    kernel, x_spec, x_scratch, semantics = x_input(
        functools.partial(fused_matmul_kernel, epilogue=epilogue, transpose_w=transpose_w,
                          n_operands=len(operands), single_k=single_k),
        x, bm, bk, n // bn, buffers, x_panel, ("parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, kdim // bk),
        in_specs=[x_spec, w_spec(bk, bn, transpose_w, buffers), *(_operand_spec(a.shape, bm, bn) for a in operands)],
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct(out_shape, x.dtype),
        scratch_shapes=[*accumulator(bm, bn, single_k), *x_scratch],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT),
    )(x, w, *operands)


def weight_sums_kernel(w_ref, o_ref, *, axis):
    @pl.when(pl.program_id(1) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.sum(w_ref[...].astype(jnp.float32), axis=axis, keepdims=True)


def row_dot_kernel(x_ref, v_ref, *refs, epilogue, n_operands):
    operand_refs, (o_ref, acc_ref) = refs[:n_operands], refs[n_operands:]
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32) * v_ref[...], axis=-1, keepdims=True)

    @pl.when(k == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = epilogue(acc_ref[...], *(r[...] for r in operand_refs)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("epilogue", "transpose_w", "bm", "bk", "bn", "buffers", "x_panel"))
def folded_matmul(x, w, operands=(), *, epilogue, transpose_w=False, bm, bk, bn=None, buffers=2, x_panel="pipelined"):
    """epilogue(row sums of x @ w), computed as x @ (w summed over its N output columns):
    the reduction folded into the weights, N times fewer FLOPs, exact up to rounding. Two
    kernels: the weight sums (1, K) in f32, then each row of x dotted with them. Each block
    of x is read once, so there is no panel to prefetch (``x_panel`` 'pipelined' only)."""
    assert x_panel == "pipelined", "the folded kernel has no x panel to prefetch"
    m, kdim = x.shape
    n = w.shape[0] if transpose_w else w.shape[1]
    bk = bk or kdim
    rows = 512 if n % 512 == 0 else n  # output columns summed per step
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                  vmem_limit_bytes=VMEM_LIMIT)
    if transpose_w:  # w (N, K): sum over its rows
        w_blocks = pl.BlockSpec((rows, bk), lambda k, j: (j, k))
        sums_spec, sums_shape = pl.BlockSpec((1, bk), lambda k, j: (0, k)), (1, kdim)
    else:  # w (K, N): sum over its columns
        w_blocks = pl.BlockSpec((bk, rows), lambda k, j: (k, j))
        sums_spec, sums_shape = pl.BlockSpec((bk, 1), lambda k, j: (k, 0)), (kdim, 1)
    sums = pl.pallas_call(
        functools.partial(weight_sums_kernel, axis=0 if transpose_w else 1),
        grid=(kdim // bk, n // rows), in_specs=[w_blocks], out_specs=sums_spec,
        out_shape=jax.ShapeDtypeStruct(sums_shape, jnp.float32), compiler_params=params,
    )(w)
    return pl.pallas_call(
        functools.partial(row_dot_kernel, epilogue=epilogue, n_operands=len(operands)),
        grid=(m // bm, kdim // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, k: (i, k), **pipelined(buffers)),
                  pl.BlockSpec((1, bk), lambda i, k: (0, k)),
                  *(pl.BlockSpec(a.shape, lambda i, k: (0, 0)) for a in operands)],  # scalars (1, 1)
        out_specs=pl.BlockSpec((bm, 1), lambda i, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32)],
        compiler_params=params,
    )(x, sums.reshape(1, kdim), *operands)


def _row_reduce(x, w, operands, epilogue, combine, finish, n_carries, transpose_w, out_cols, bm, bk, bn, buffers,
                single_k, keep=None, x_panel="pipelined"):
    m, kdim = x.shape
    n = w.shape[0] if transpose_w else w.shape[1]
    kernel, x_spec, x_scratch, semantics = x_input(
        functools.partial(row_reduce_kernel, epilogue=epilogue, combine=combine, finish=finish,
                          transpose_w=transpose_w, n_operands=len(operands), single_k=single_k, keep=keep),
        x, bm, bk, n // bn, buffers, x_panel, ("parallel", "arbitrary", "arbitrary"))
    if keep is not None:  # the kept tiles, and the carries so far at each tile (N tiles, carries, M, 1) in f32
        out_specs = [pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
                     pl.BlockSpec((1, n_carries, bm, 1), lambda i, j, k: (j, 0, i, 0))]
        out_shape = [jax.ShapeDtypeStruct((m, n), x.dtype),
                     jax.ShapeDtypeStruct((n // bn, n_carries, m, 1), jnp.float32)]
    else:  # written at the row's last tile
        out_specs = pl.BlockSpec((bm, out_cols), lambda i, j, k: (i, 0))
        out_shape = jax.ShapeDtypeStruct((m, out_cols), x.dtype)
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, kdim // bk),
        in_specs=[x_spec, w_spec(bk, bn, transpose_w, buffers), *(_operand_spec(a.shape, bm, bn) for a in operands)],
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((n_carries, bm, 128), jnp.float32), *accumulator(bm, bn, single_k), *x_scratch],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT),
    )(x, w, *operands)


class RowMap(NamedTuple):
    """A row-wise map that needs a reduction of its row first. ``rows(v)`` maps whole rows in
    one go. Across column tiles, a row's carries are ``carries(v)`` for one tile, merged with
    ``combine`` across tiles (as a ``reduction``'s); each tile is kept as ``keep(v, *carries
    so far)`` and mapped once the row is done by ``apply(kept, carries so far, row carries)``
    (two tuples). Keeping v relative to the carries so far (v minus the running max, say)
    keeps it precise in the output dtype."""

    rows: Callable
    carries: Callable
    combine: Callable
    keep: Callable
    apply: Callable


@functools.partial(jax.jit, static_argnames=("epilogue", "row_map", "transpose_w", "bm", "bk", "bn", "buffers",
                                             "x_panel"))
def row_mapped_matmul(x, w, operands=(), *, epilogue, row_map, transpose_w=False, bm, bk, bn=None, buffers=2,
                      x_panel="pipelined"):
    """row_map over the rows of v = epilogue(x @ w). Whole rows (bn None or N): one kernel
    does it all at each row block's last step. Narrower column tiles: two passes. The kernel
    carries the row's reduction across its tiles and writes each tile as ``row_map.keep``
    makes it, then a second kernel maps the kept tiles in place by their rows' carries:
    one more HBM round trip of the output, and the weights stream once per ``bm`` rows, not
    once per the fewer rows a whole f32 row tile allows."""
    n = w.shape[0] if transpose_w else w.shape[1]

    if bn is None or bn == n:
        return fused_matmul(x, w, operands, epilogue=lambda *a: row_map.rows(epilogue(*a)),
                            transpose_w=transpose_w, bm=bm, bk=bk, bn=bn, buffers=buffers, x_panel=x_panel)

    def tile_and_carries(*a):
        v = epilogue(*a)
        return v, row_map.carries(v)

    n_carries = len(jax.eval_shape(row_map.carries, jax.ShapeDtypeStruct((8, 128), jnp.float32)))
    kept, so_far = _row_reduce(x, w, operands, tile_and_carries, row_map.combine, None, n_carries, transpose_w,
                               None, bm, bk or x.shape[1], bn, buffers, bk is None, keep=row_map.keep,
                               x_panel=x_panel)
    tiles = n // bn

    def carries_spec(tile):  # row block i's carries so far at column tile tile(t)
        return pl.BlockSpec((1, n_carries, bm, 1), lambda i, t: (tile(t), 0, i, 0))

    return pl.pallas_call(
        functools.partial(row_apply_kernel, apply=row_map.apply),
        grid=(x.shape[0] // bm, tiles),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, t: (i, t)), carries_spec(lambda t: t),
                  carries_spec(lambda t: tiles - 1)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, t: (i, t)),
        out_shape=jax.ShapeDtypeStruct(kept.shape, kept.dtype),
        input_output_aliases={0: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(kept, so_far, so_far)


def row_apply_kernel(kept_ref, at_tile_ref, at_end_ref, o_ref, *, apply):
    """row_mapped_matmul's second pass: a kept tile mapped by its rows' carries."""
    def carries(ref):
        return tuple(ref[0, c] for c in range(ref.shape[1]))

    kept = kept_ref[...].astype(jnp.float32)
    o_ref[...] = apply(kept, carries(at_tile_ref), carries(at_end_ref)).astype(o_ref.dtype)


# Row reductions as (combine, finish, carries) for fused_matmul's ``reduction``.
def _lse_combine(a, b):
    top = jnp.maximum(a[0], b[0])
    return top, a[1] * jnp.exp(a[0] - top) + b[1] * jnp.exp(b[0] - top)


def lse_carries(v):
    """A tile's logsumexp carries: row max and the sum of exp(v - max)."""
    top = jnp.max(v, axis=-1, keepdims=True)
    return top, jnp.sum(jnp.exp(v - top), axis=-1, keepdims=True)


def logsumexp_reduction(then=lambda lse: lse):
    return (_lse_combine, lambda c: then(c[0] + jnp.log(c[1])), 2)


SUM_REDUCTION = (lambda a, b: (a[0] + b[0],), lambda c: c[0], 1)
MIN_REDUCTION = (lambda a, b: (jnp.minimum(a[0], b[0]),), lambda c: c[0], 1)
MAX_REDUCTION = (lambda a, b: (jnp.maximum(a[0], b[0]),), lambda c: c[0], 1)


def tiling():
    """The schedule's tiling arguments for fused_matmul."""
    s = SCHEDULE
    whole_k = s.get("accumulator") == "none"
    return dict(bm=s["block_m"], bk=None if whole_k else s["block_k"], bn=s.get("block_n"), buffers=s["buffers"],
                x_panel=s.get("x_panel", "pipelined"))


def row(v):
    """A length-N vector as a (1, N) operand."""
    return v.reshape(1, -1)


# Elementwise pieces the epilogues share, on f32 tiles.
def gelu(v):
    return 0.5 * v * (1.0 + jnp.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))


def swish(v):
    return v * jax.nn.sigmoid(v)


def mish(v):
    return v * jnp.tanh(jnp.logaddexp(v, 0.0))


def softmax_rows(v):
    e = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


SOFTMAX = RowMap(softmax_rows, lse_carries, _lse_combine, lambda v, top, total: jnp.exp(v - top),
                 lambda e, at_tile, at_end: e * (jnp.exp(at_tile[0] - at_end[0]) / at_end[1]))


def after_row_max(f):
    """The RowMap f(v - the row's max)."""
    def row_max(v):
        return (jnp.max(v, axis=-1, keepdims=True),)

    return RowMap(lambda v: f(v - row_max(v)[0]), row_max, MAX_REDUCTION[0], lambda v, top: v - top,
                  lambda d, at_tile, at_end: f(d + (at_tile[0] - at_end[0])))


def logsumexp_rows(v):
    top = jnp.max(v, axis=-1, keepdims=True)
    return top + jnp.log(jnp.sum(jnp.exp(v - top), axis=-1, keepdims=True))


def group_mean(v, group):
    """Each column replaced by the mean of its run of ``group`` columns. A matmul with a
    block-diagonal averaging matrix, because Mosaic cannot split the lane dimension into
    (groups, group); done per 256 columns to keep that matrix small."""
    width = min(256, v.shape[-1])
    same = (jax.lax.broadcasted_iota(jnp.int32, (width, width), 0) // group
            == jax.lax.broadcasted_iota(jnp.int32, (width, width), 1) // group)
    avg = jnp.where(same, 1.0 / group, 0.0).astype(jnp.float32)
    chunks = [jnp.dot(v[:, c:c + width], avg, precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32) for c in range(0, v.shape[-1], width)]
    return chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks, axis=-1)


def group_norm(v, group, eps, weight, bias):
    """GroupNorm over runs of ``group`` columns (biased variance), then the affine."""
    centered = v - group_mean(v, group)
    return centered * jax.lax.rsqrt(group_mean(centered * centered, group) + eps) * weight + bias
