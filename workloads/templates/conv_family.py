"""Convolution + fused epilogue as an im2col matmul Pallas TPU kernel (KernelBench conv family).

The input is flattened over its spatial dims: the window offset (i, j) of a 2-D conv is
then the flat shift i*W + j, so each of the kernel's taps is one shifted slice of the flat
input. Its columns are the output positions on the INPUT's grid ("wide" rows: Ho*W
positions for 2-D), of which those with a column index (and, in 3-D, a row index) past
the output's extent are wrap-around garbage: the kernel gets a (1, Sp) 0/1 mask of the
valid ones, and the glue slices them away.

Per batch element the kernel computes the tile acc(R, bs) = Wm(R, KC) @ P[:, s-block]
(KC = taps*Cin, tap-major) in an f32 VMEM accumulator, then applies the workload's
``epilogue`` to the finished tile in VMEM and stores it, so the conv output never
round-trips through HBM before its activation/normalisation. Where P comes from:
* patches="hbm": XLA writes P (N, KC, Sp) to HBM (one fusion of shifted slices) and the
  kernel streams it in (block_k, block_s) blocks;
* patches="vmem": the kernel holds each sample's flat input (Cin, L) in VMEM and slices
  each tap's (Cin, bs) window itself (one dot per tap): no patch matrix in HBM;
* patches="vmem_im2col": the same windows stacked into a (taps*Cin, bs) patch tile in VMEM
  and one dot with the (R, taps*Cin) weights, a deeper contraction for the MXU.
Two output modes:
* tile (``reduce=False``): the epilogue maps the (R, bs) tile to an (out_rows, bs) tile.
  ``block_s=None`` makes one block span all of Sp, for epilogues that need whole-image
  statistics (instance/group norm: they must weight columns by the mask).
* reduce (``reduce=True``): the epilogue maps the tile to (out_rows, 1) partial sums
  (masked), accumulated over the S blocks into an (N, out_rows) f32 output.

Layout "hwnc" (2-D convs with an elementwise epilogue or a norm after): the TPU keeps an NCHW conv output
whose images are not lane-wide (126x126) in its device layout (H, W, N, C), batch and
channels in the tiles, and XLA's conv writes it so directly. The flat kernel's (N, C, S)
output costs a whole-array relayout copy and a crop on top. ``conv2d_hwnc`` computes in that
layout: XLA transposes the input once to (H, W, N, Cin), and each grid step takes block_h
output rows of every sample, reading its rows plus the K-1 rows below (a second BlockSpec on
the same input, in (K-1)-row blocks), and loops over the samples block_n at a time; for each
output row and kernel row the K shifted (Wo*nb, Cin) windows are stacked into one
(Wo*nb, K*Cin) slab for one dot. The (Ho, Wo, N, C) result transposes to NCHW as a
bitcast. With ``pack`` columns side by side in the input's lanes one dot makes that many
output columns; with ``stats`` the kernel also sums each sample's channels and their squares,
for a norm in glue that then reads the output once.

The workload's own code (SCHEDULE, epilogue, ``workload``) follows this family code.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Whole-image blocks (instance/group norm) need more than the 32 MiB default scoped VMEM;
# v6e has 128 MiB.
VMEM_LIMIT = 100 * 2**20


def round_up(n, m):
    return -(-n // m) * m


def flat_geometry(shape, ksize, block_s):
    """Flat-window geometry of a stride-1 VALID conv of an (N, C, *spatial) input: the taps'
    flat offsets, the "wide" grid (out[0] x spatial[1:]) whose positions are the columns,
    the output's spatial shape, the padded column count Sp (a multiple of block_s; Sw when
    block_s is None) and the (1, Sp) f32 mask of the columns that are real outputs."""
    sp = shape[2:]
    out = [d - k + 1 for d, k in zip(sp, ksize)]
    wide = [out[0]] + list(sp[1:])
    sw = math.prod(wide)
    spad = sw if block_s is None else round_up(sw, block_s)
    strides = [math.prod(sp[i + 1:]) for i in range(len(sp))]
    offsets = tuple(sum(o * st for o, st in zip(off, strides)) for off in np.ndindex(*ksize))
    valid = np.ones(wide, bool)
    for axis, (o, wdt) in enumerate(zip(out, wide)):
        index = np.arange(wdt).reshape([-1 if a == axis else 1 for a in range(len(wide))])
        valid &= index < o
    mask = np.zeros((1, spad), np.float32)
    mask[0, :sw] = valid.reshape(-1)
    return offsets, wide, out, spad, jnp.asarray(mask)


def flat_input(x, length, channels):
    """x (N, C, *spatial) flattened over its spatial dims, zero-padded to ``length`` columns
    and ``channels`` rows (one pad)."""
    xf = x.reshape(x.shape[0], x.shape[1], -1)
    return jnp.pad(xf, ((0, 0), (0, channels - xf.shape[1]), (0, length - xf.shape[2])))


def flat_patches(x, offsets, spad, channels):
    """The patches (N, taps*C, Sp) in HBM: one shifted slice of the flat input per tap."""
    xf = flat_input(x, spad + offsets[-1], channels)
    n, c, _ = xf.shape
    return jnp.stack([xf[:, :, o:o + spad] for o in offsets], axis=1).reshape(n, len(offsets) * c, spad)


def tap_major(w):
    """O I k.. weight -> (O, taps*I) matrix matching flat_patches' row order (tap, channel)."""
    return jnp.moveaxis(w, 1, -1).reshape(w.shape[0], -1)


def pad_to(a, axis, size):
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jnp.pad(a, widths)


def taps_dot(w_ref, x_ref, s, *, bs, offsets, halo, single, concat):
    """In-VMEM im2col: the S block's window [s*bs, s*bs + bs + halo) of the flat input, each
    tap's weights (R, C) times that tap's shifted (C, bs) slice of the window; with
    ``concat``, the slices stacked into one (taps*C, bs) patch tile and a single dot with the
    (R, taps*C) weights, a contraction taps times deeper for the MXU."""
    start = 0 if single else pl.multiple_of(s * bs, 128)
    win = x_ref[:, pl.ds(start, bs + halo)]
    if concat:
        # bf16 rows are packed in pairs, 16 to a tile: slices of fewer channels split the
        # tiles, so they are stacked in f32 (25k's 27 three-row slices: predicted 25% faster).
        split_tiles = win.dtype.itemsize == 2 and win.shape[0] % 16
        parts = win.astype(jnp.float32) if split_tiles else win
        patch = jnp.concatenate([parts[:, o:o + bs] for o in offsets], axis=0).astype(w_ref.dtype)
        return jnp.dot(w_ref[...], patch, preferred_element_type=jnp.float32)
    acc = None
    for t, o in enumerate(offsets):
        part = jnp.dot(w_ref[t], win[:, o:o + bs], preferred_element_type=jnp.float32)
        acc = part if acc is None else acc + part
    return acc


def flatten_sample(x_ref, flat_ref):
    """A sample's (C, H, W) input as the flat (C, H*W, then zeros) f32 rows the taps slice:
    16 rows (a bf16 tile) loaded at a time, each stored at its W-wide lane offset."""
    c, h, wd = x_ref.shape
    flat_ref[:, h * wd:] = jnp.zeros((c, flat_ref.shape[1] - h * wd), jnp.float32)

    def rows(i, carry):
        base = pl.multiple_of(i * 16, 16)
        chunk = x_ref[:, pl.ds(base, 16), :].astype(jnp.float32)
        for r in range(16):
            flat_ref[:, pl.ds(pl.multiple_of((base + r) * wd, 128), wd)] = chunk[:, r, :]
        return carry

    jax.lax.fori_loop(0, h // 16, rows, 0)


def conv_kernel(w_ref, p_ref, mask_ref, *refs, epilogue, n_params, reduce, taps, accumulate, flatten):
    params = refs[:n_params]
    o_ref, scratch = refs[n_params], refs[n_params + 1:]
    s, k = pl.program_id(1), pl.program_id(2)
    last_k = k == pl.num_programs(2) - 1
    if flatten:  # p_ref is the sample's (C, H, W) input; its flat rows live in the last scratch
        x_ref, scratch = scratch[-1], scratch[:-1]

        @pl.when((s == 0) & (k == 0))
        def _flatten():
            flatten_sample(p_ref, x_ref)
    else:
        x_ref = p_ref

    def block_dot():
        if taps is None:  # patches from HBM
            return jnp.dot(w_ref[...], p_ref[...], preferred_element_type=jnp.float32)
        return taps_dot(w_ref, x_ref, s, **taps)

    if accumulate:  # summed over K steps in an f32 scratch
        acc_ref, scratch = scratch[0], scratch[1:]

        @pl.when(k == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += block_dot()

        def finished_tile():
            return epilogue(acc_ref[...], mask_ref[...], *(r[...] for r in params))
    else:  # one K step: the dot goes straight to the epilogue
        def finished_tile():
            return epilogue(block_dot(), mask_ref[...], *(r[...] for r in params))

    if not reduce:
        @pl.when(last_k)
        def _store():
            o_ref[...] = finished_tile().astype(o_ref.dtype)
        return

    red_ref = scratch[0]

    @pl.when((s == 0) & (k == 0))
    def _init_red():
        red_ref[...] = jnp.zeros_like(red_ref)

    @pl.when(last_k)
    def _accumulate():
        red_ref[...] += finished_tile()

    @pl.when(last_k & (s == pl.num_programs(1) - 1))
    def _store():
        o_ref[...] = red_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("epilogue", "out_rows", "reduce", "bs", "bk", "buffers", "out_dtype",
                                             "accumulator", "offsets", "sp", "flat_length"))
def conv_matmul(wm, patches, mask, params, *, epilogue, out_rows, reduce, bs, bk, buffers, out_dtype,
                accumulator="vmem", offsets=None, sp=None, flat_length=None):
    """Per batch element: wm (R, KC) @ patches (N, KC, Sp), epilogue fused; or, with the taps'
    ``offsets``, wm (taps, R, C) against the flat input ``patches`` (N, C, L), whose windows
    the kernel slices itself (Sp columns). mask (1, Sp) marks valid columns; params are
    small 2-D arrays (per-channel (R, 1) columns, ...) given whole to every grid step.
    ``accumulator`` "vmem": the dot is summed into an f32 VMEM scratch, the epilogue reads
    it back; "none" (one K step only): the dot's value goes to the epilogue directly. With
    ``flat_length``, ``patches`` is the (N, C, H, W) input itself, flattened by the kernel
    at each sample's first step into an f32 (C, flat_length) scratch (W a multiple of 128,
    H of 16), so the S axis runs in order."""
    pipeline = {} if buffers == 2 else {"pipeline_mode": pl.Buffered(buffers)}
    n = patches.shape[0]
    if offsets is None:
        (rows, kc), sp = wm.shape, patches.shape[2]
        w_spec = pl.BlockSpec((rows, bk), lambda b, s, k: (0, k), **pipeline)
        p_spec = pl.BlockSpec((None, bk, bs), lambda b, s, k: (b, k, s), **pipeline)
        k_steps, taps = kc // bk, None
    else:
        concat = wm.ndim == 2  # (R, taps*C) weights: one dot over the stacked taps
        rows = wm.shape[0] if concat else wm.shape[1]
        w_spec = pl.BlockSpec(wm.shape, lambda b, s, k: (0,) * wm.ndim)
        p_spec = pl.BlockSpec((None, *patches.shape[1:]), lambda b, s, k: (b,) + (0,) * (patches.ndim - 1),
                              **pipeline)
        k_steps = 1
        length = flat_length or patches.shape[2]
        taps = {"bs": bs, "offsets": offsets, "halo": length - sp, "single": sp == bs, "concat": concat}
    in_specs = [w_spec, p_spec, pl.BlockSpec((1, bs), lambda b, s, k: (0, s))]
    in_specs += [pl.BlockSpec(p.shape, lambda b, s, k: (0, 0)) for p in params]
    assert accumulator == "vmem" or k_steps == 1, "accumulator='none' needs the contraction in one step"
    scratch = [pltpu.VMEM((rows, bs), jnp.float32)] if accumulator == "vmem" else []
    if reduce:
        out_spec = pl.BlockSpec((None, out_rows, 1), lambda b, s, k: (b, 0, 0))
        out_shape = jax.ShapeDtypeStruct((n, out_rows, 1), out_dtype)
        scratch.append(pltpu.VMEM((out_rows, 1), jnp.float32))
        semantics = ("parallel", "arbitrary", "arbitrary")
    else:
        out_spec = pl.BlockSpec((None, out_rows, bs), lambda b, s, k: (b, 0, s))
        out_shape = jax.ShapeDtypeStruct((n, out_rows, sp), out_dtype)
        semantics = ("parallel", "arbitrary" if flat_length else "parallel", "arbitrary")
    if flat_length:
        scratch.append(pltpu.VMEM((patches.shape[1], flat_length), jnp.float32))
    kernel = functools.partial(conv_kernel, epilogue=epilogue, n_params=len(params), reduce=reduce, taps=taps,
                               accumulate=accumulator == "vmem", flatten=bool(flat_length))
    return pl.pallas_call(
        kernel,
        grid=(n, sp // bs, k_steps),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT),
    )(wm, patches, mask, *params)


def conv_nd(x, wm, ksize, params, epilogue, *, block_s, block_k, buffers, patches="hbm", accumulator="vmem",
            pad_cin=1, flatten="xla", out_rows=None, reduce=False, out_dtype=None):
    """Stride-1 VALID conv of x (N, Cin, *spatial) with the tap-major matrix wm (R, taps*Cin),
    ``epilogue`` fused. Returns (N, out_rows, *out_spatial) in tile mode, (N, out_rows) f32
    sums in reduce mode. block_s=None: one block spans all output positions.
    patches="hbm": XLA writes the patches, the kernel streams them in K blocks (block_k at
    least the contraction: all of it in one step; below it, the contraction is zero-padded
    to a multiple of 128 that block_k must divide). patches="vmem": the kernel keeps each
    sample's flat input in VMEM and slices the taps itself (block_k unused). ``accumulator``:
    see ``conv_matmul``. ``pad_cin``: the input channels zero-padded to a multiple of it,
    with zero weights, so each tap's slice is whole f32 sublane tiles. ``flatten`` "kernel"
    (2-D, patches="vmem_im2col", no channel padding): the kernel flattens each sample's input
    itself (``conv_matmul``'s ``flat_length``), with no relayout copy and pad in XLA."""
    cin, channels = x.shape[1], round_up(x.shape[1], pad_cin)
    if channels > cin:
        wm = jnp.pad(wm.reshape(wm.shape[0], -1, cin), ((0, 0), (0, 0), (0, channels - cin))).reshape(wm.shape[0], -1)
    offsets, wide, out, sp, mask = flat_geometry(x.shape, ksize, block_s)
    bs = sp if block_s is None else block_s
    rows = wm.shape[0] if out_rows is None else out_rows
    common = dict(epilogue=epilogue, out_rows=rows, reduce=reduce, bs=bs, buffers=buffers, accumulator=accumulator,
                  out_dtype=jnp.float32 if reduce else (out_dtype or x.dtype))
    if patches in ("vmem", "vmem_im2col"):
        halo = round_up(offsets[-1], 128)
        wt = wm if patches == "vmem_im2col" else wm.reshape(wm.shape[0], len(offsets), -1).transpose(1, 0, 2)
        if flatten == "kernel":
            assert patches == "vmem_im2col" and x.ndim == 4 and channels == cin, "flatten='kernel' takes 2-D im2col"
            y = conv_matmul(wt, x, mask, tuple(params), bk=None, offsets=offsets, sp=sp, flat_length=sp + halo,
                            **common)
        else:
            y = conv_matmul(wt, flat_input(x, sp + halo, channels), mask, tuple(params), bk=None, offsets=offsets,
                            sp=sp, **common)
    else:
        p = flat_patches(x, offsets, sp, channels)
        kc = wm.shape[1]
        kcp = kc if block_k >= kc else round_up(kc, 128)
        y = conv_matmul(wm if kcp == kc else pad_to(wm, 1, kcp), p if kcp == kc else pad_to(p, 1, kcp), mask,
                        tuple(params), bk=min(kc, block_k), **common)
    if reduce:
        return y[:, :, 0]
    y = y[:, :, :math.prod(wide)].reshape(y.shape[0], rows, *wide)
    return y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]


def flat_knobs(s):
    """The flat kernel's knobs in a SCHEDULE, as ``conv_nd``'s keyword arguments."""
    knobs = ("block_s", "block_k", "buffers", "patches", "accumulator", "pad_cin", "flatten")
    return {key: s[key] for key in knobs if key in s}


def conv2d_hwnc_kernel(w_ref, x_ref, halo_ref, *refs, epilogue, n_params, stats):
    params = [r[...] for r in refs[:n_params]]
    o_ref = refs[n_params]
    rows, wo, _, cout = o_ref.shape
    (k, depth, wide), (groups, nb, lanes) = w_ref.shape, x_ref.shape[2:]
    pack, packs = wide // cout, depth // lanes  # output columns per matmul row, input packs per window
    wop = wo // pack
    if stats:
        stats_ref = refs[n_params + 1]

        @pl.when(pl.program_id(0) == 0)
        def _init():
            stats_ref[...] = jnp.zeros_like(stats_ref)

    def samples(g):
        def window(row, dp):
            """Input row ``row`` of this step (its own rows, then the halo's), column packs dp..dp+Wo/pack."""
            ref, r = (x_ref, row) if row < rows else (halo_ref, row - rows)
            return ref[r, pl.ds(dp, wop), g].reshape(wop * nb, lanes)

        samples_g = pl.ds(pl.multiple_of(g * nb, nb), nb)
        for r in range(rows):
            acc = None
            for di in range(k):
                slab = jnp.concatenate([window(r + di, dp) for dp in range(packs)], axis=-1)
                part = jnp.dot(slab, w_ref[di], preferred_element_type=jnp.float32)
                acc = part if acc is None else acc + part
            y = epilogue(acc, None, *params).reshape(wop, nb, wide)
            # Lanes (column in pack, channel) -> output columns: whole (nb, Cout) tiles move.
            cols = [y[:, :, c * cout:(c + 1) * cout] for c in range(pack)]
            out = cols[0] if pack == 1 else jnp.stack(cols, axis=1).reshape(wo, nb, cout)
            o_ref[r, :, samples_g] = out.astype(o_ref.dtype)
            if stats:  # per sample and channel, from the f32 values: sum and sum of squares
                stats_ref[0, samples_g] += sum(jnp.sum(c, axis=0) for c in cols)
                stats_ref[1, samples_g] += sum(jnp.sum(c * c, axis=0) for c in cols)
        return g + 1

    # A while loop, not fori_loop: one group (small check sizes) must lower as several do.
    jax.lax.while_loop(lambda g: g < groups, samples, jnp.int32(0))


def packed_row_weights(w, pack):
    """w (Cout, Cin, K, K) -> per kernel row, the (packs*pack*Cin, pack*Cout) matrix taking a
    window of ``packs`` input column packs (pack columns of Cin channels each) to ``pack``
    adjacent output columns: entry ((input column, ci), (output column, co)) is the tap at
    their column distance, zero where that is outside the kernel. pack=1: (K*Cin, Cout)."""
    cout, cin, k, _ = w.shape
    packs = -(-(pack + k - 1) // pack)
    distance = np.arange(packs * pack)[:, None, None] - np.arange(pack)[None, :, None]
    taps = (distance == np.arange(k)).astype(np.float32)  # (input column, output column, tap)
    wd = jnp.einsum("cpj,oidj->dcipo", taps, w.astype(jnp.float32))
    return wd.reshape(k, packs * pack * cin, pack * cout).astype(w.dtype)


def pair_columns_kernel(perm_ref, x_ref, o_ref):
    nb, cin, hb, wd = x_ref.shape
    # Lanes w -> (w % 2, w // 2) by an exact 0/1 matmul, then per sample and row the channels
    # into the lanes by transposes, the two column halves side by side, the samples inward.
    x = jnp.dot(x_ref[...].reshape(nb * cin * hb, wd), perm_ref[...], preferred_element_type=jnp.float32)
    x = pltpu.einshape("nchw->nhcw", x.reshape(nb, cin, hb, wd))
    x = pltpu.einshape("nhcw->nhwc", x)  # (nb, hb, (w % 2, w // 2), cin)
    x = jnp.concatenate([x[:, :, :wd // 2, :], x[:, :, wd // 2:, :]], axis=-1)
    o_ref[...] = pltpu.einshape("nhvk->hvnk", x).astype(o_ref.dtype)


def pair_columns(x):
    """x (N, C, H, W) -> (H, W/2, N, 2C), adjacent columns' channels side by side in the lanes:
    one pass where XLA makes two copies (one transpose cannot merge two dims into the lanes)."""
    n, cin, h, wd = x.shape
    nb, hb = (8 if n % 8 == 0 else n), (16 if h % 16 == 0 else h)
    w = np.arange(wd)
    perm = np.zeros((wd, wd), np.float32)
    perm[w, (w % 2) * (wd // 2) + w // 2] = 1.0
    return pl.pallas_call(
        pair_columns_kernel,
        grid=(h // hb, n // nb),
        in_specs=[pl.BlockSpec((wd, wd), lambda i, j: (0, 0)),
                  pl.BlockSpec((nb, cin, hb, wd), lambda i, j: (j, 0, i, 0))],
        out_specs=pl.BlockSpec((hb, wd // 2, nb, 2 * cin), lambda i, j: (i, 0, j, 0)),
        out_shape=jax.ShapeDtypeStruct((h, wd // 2, n, 2 * cin), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(jnp.asarray(perm, x.dtype), x)


@functools.partial(jax.jit, static_argnames=("epilogue", "block_h", "block_n", "pack", "channels_first", "stats"))
def conv2d_hwnc(x, w, params, epilogue, *, block_h, block_n, pack=1, channels_first=True, stats=False):
    """Stride-1 VALID 2-D conv of x (N, Cin, H, W) with w (Cout, Cin, K, K), ``epilogue``
    applied to each (Wo*nb/pack, pack*Cout) f32 row tile with ``params`` as (1, Cout) rows;
    returns (N, Cout, Ho, Wo), or (Ho, Wo, N, Cout) for glue that goes on in that layout. A grid
    step takes block_h output rows of every sample and loops over the samples nb =
    min(block_n, N) at a time; block_h must divide Ho and be a multiple of K-1. ``pack``
    adjacent columns share a matmul row: the input's are laid side by side in its lanes (64
    channels fill 128 lanes at pack=2) and the dot makes ``pack`` output columns at once,
    deeper and wider for the MXU (pack must divide W and Wo). With ``stats``, also the f32
    (2, N, Cout) sums over the positions of the epilogue's values and of their squares, so
    glue normalising by them (instance, batch norm) reads the output once and not the conv."""
    n, cin, h, wd = x.shape
    cout, _, k, _ = w.shape
    ho, wo, halo, nb = h - k + 1, wd - k + 1, k - 1, min(block_n, n)
    # (H, W/pack, groups, nb, pack*Cin): one transposing copy, or pair_columns' one pass for 64
    # channels at pack=2 (XLA makes two copies: one transpose cannot merge two dims into the
    # lanes); the samples as (groups, nb) are a bitcast when nb fills the sublane tiles. The
    # output stays 4-D: XLA does not fuse an elementwise consumer across a bitcast that splits N.
    if pack == 2 and 2 * cin == 128:
        xt = pair_columns(x)
    else:
        xt = jnp.transpose(x.reshape(n, cin, h, wd // pack, pack), (2, 3, 0, 4, 1))
    xt = xt.reshape(h, wd // pack, n // nb, nb, pack * cin)
    wt = packed_row_weights(w, pack)
    params = tuple(jnp.tile(p, (1, pack)) for p in params)
    out_specs = [pl.BlockSpec((block_h, wo, n, cout), lambda i: (i, 0, 0, 0))]
    out_shape = [jax.ShapeDtypeStruct((ho, wo, n, cout), x.dtype)]
    if stats:  # one block, resident over the grid, which must then run in order
        out_specs.append(pl.BlockSpec((2, n, cout), lambda i: (0, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((2, n, cout), jnp.float32))
    outs = pl.pallas_call(
        functools.partial(conv2d_hwnc_kernel, epilogue=epilogue, n_params=len(params), stats=stats),
        grid=(ho // block_h,),
        in_specs=[pl.BlockSpec(wt.shape, lambda i: (0, 0, 0)),
                  pl.BlockSpec((block_h, *xt.shape[1:]), lambda i: (i, 0, 0, 0, 0)),
                  pl.BlockSpec((halo, *xt.shape[1:]), lambda i: ((i + 1) * block_h // halo, 0, 0, 0, 0))]
                 + [pl.BlockSpec(p.shape, lambda i: (0, 0)) for p in params],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary" if stats else "parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(wt, xt, xt, *params)
    out = jnp.transpose(outs[0], (2, 3, 0, 1)) if channels_first else outs[0]
    return (out, outs[1]) if stats else out


def row(v):
    """A per-channel vector as an f32 (1, C) operand of the hwnc kernel's (positions, C) tiles."""
    return v.reshape(1, -1).astype(jnp.float32)


def column(v):
    """A per-channel vector as an f32 (C, 1) kernel operand (broadcasts along a tile's columns)."""
    return v.reshape(-1, 1).astype(jnp.float32)


def group_matrix(channels, groups):
    """(C, C) 0/1 matrix joining the channels of each group: G @ per-channel sums = per-group sums."""
    g = np.arange(channels) // (channels // groups)
    return jnp.asarray((g[:, None] == g[None, :]).astype(np.float32))


def group_sum(g, v):
    """Per-group totals of the per-channel (C, 1) column v, repeated per channel. The column is
    widened to 128 lanes so the product is an ordinary MXU matmul."""
    wide = jnp.broadcast_to(v, (v.shape[0], 128))
    return jnp.dot(g, wide, preferred_element_type=jnp.float32)[:, :1]


def moments(sums, count):
    """Mean and biased variance from ``conv2d_hwnc``'s stacked sums of values and of their
    squares (leading axis 2) over ``count`` positions each."""
    mean = sums[0] / count
    return mean, jnp.maximum(sums[1] / count - mean * mean, 0.0)


def masked_mean(v, mask):
    """Per-row mean of the (R, S) tile v over the columns where mask (1, S) is 1."""
    return jnp.sum(v * mask, axis=1, keepdims=True) / jnp.sum(mask)


def group_norm(y, mask, g, group_size, eps):
    """Normalise the (C, S) tile y per channel group (statistics over the group's channels and
    the valid columns), variance biased, in f32."""
    count = group_size * jnp.sum(mask)
    mean = group_sum(g, jnp.sum(y * mask, axis=1, keepdims=True)) / count
    d = y - mean
    var = group_sum(g, jnp.sum(d * d * mask, axis=1, keepdims=True)) / count
    return d * jax.lax.rsqrt(var + eps)
