"""The KernelBench convolution workloads (18k, 22k, 25k, 28k, 33k, 34k, 39k, 46k).

Each class states its inputs (workloads.md section 3; x ~ U[0,1) keyed by K0, weights
N*0.02 keyed as the entry says), its plain-JAX reference and its template part: SCHEDULE
defaults, the epilogue fused into the family's im2col-matmul kernel (``conv_family``) and the
``workload`` glue.

The references are JAXBench's programs op for op (the XLA baseline, so speedups compare with
JAXBench's): the NCHW/OIHW inputs are transposed to channels-last, the convolution (stride 1,
default precision) and the conv bias run channels-last, and the result is transposed back to
channels-first where JAXBench does so (39k reduces channels-last and never does; 33k only at
the end). XLA's layout assignment makes those transposes free for the stride-1 convs (the
compiled programs match the channels-first formulation's), but not for 28k's.

Inputs at the check's seeds (never 0): structured by ``kernelbench``'s shared rules, with
the images' rows the (sample, channel) pairs and the positions their columns (``IMAGE``):
per-image and per-position means and scales, spatial patterns shared across images (the
low-rank part) and hot pixels (outliers); the weights' rows are their output channels
(``row_axes=1``); biases at ``kernelbench.BIAS_SCALE``; the spec's constant norm
parameters around 1 and 0.

Check sizes keep the channels and kernel (so the contraction, and the output scale, are the
full-size ones) and shrink batch and spatial extent so the interpret-mode grid stays small
(a few steps per sample); the template pads the output positions to its S block, so every
schedule runs with its own tiling at check size too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .base import Knob, over_vmem, tile_bytes
from .conv_family import EPILOGUE_TEMPS, VMEM_LIMIT, ConvWorkload, conv_channels_last, round_up, to_channels_first
from .essential import io_bytes
from .kernelbench import K0, K42, KB, bias, constant, keys, normal, side_key, uniform

EPS = 1e-5
IMAGE = {"row_axes": 2}  # structured images: rows (sample, channel), columns the positions
WEIGHT = {"row_axes": 1}  # structured conv weights: rows the output channels


def channel(v, nd):
    """A per-channel vector shaped (1, C, 1...) to broadcast over an NC(D)HW array with nd
    spatial dims."""
    return v.reshape((1, -1) + (1,) * nd)


def last(v, nd):
    """A per-channel vector shaped (1..., C) to broadcast over an N(D)HWC array."""
    return v.reshape((1,) * (nd + 1) + (-1,))


class Conv2dReluBiasAdd(ConvWorkload):
    """18k conv2d_relu_biasadd (KB L2 #1): out = relu(conv(x, w) + conv_bias) + bias.

    Inputs: x (128,64,128,128) from split(K0,2)[0]; w (128,64,3,3), conv_bias (128,), bias
    (128,1,1) N*0.02 from split(KB,3). Output (128,128,126,126), tolerance 1e-2/1e-2. The
    epilogue is tile-local, so the kernel tiles the 15876 output positions by block_s.
    Check size: batch 2, 20x20 (18 x 20 = 360 "wide" positions, padded to the S block).
    """

    name = "conv2d_relu_biasadd"
    jaxbench_id = "18k"
    description = "conv2d 3x3 then relu, + per-channel bias (KB L2 #1)"
    defaults = {"batch_size": 128, "in_channels": 64, "out_channels": 128, "kernel_size": 3,
                "height": 128, "width": 128, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "height": 20, "width": 20}
    hwnc = True
    template_part = '''
SCHEDULE = {"block_s": 2048, "block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem", "layout": "flat",
            "block_h": 2, "block_n": 32, "pack_w": 1}


def relu_bias_epilogue(acc, mask, conv_bias, bias):
    return jnp.maximum(acc + conv_bias, 0.0) + bias


def workload(x, w, conv_bias, bias):
    s = SCHEDULE
    if s["layout"] == "hwnc":
        return conv2d_hwnc(x, w, (row(conv_bias), row(bias)), relu_bias_epilogue, block_h=s["block_h"],
                           block_n=s["block_n"], pack=s["pack_w"])
    return conv_nd(x, tap_major(w), w.shape[2:], (column(conv_bias), column(bias)), relu_bias_epilogue, **flat_knobs(s))
'''

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k = c["kernel_size"]
        x = uniform(keys(K0, 2, seed)[0], (c["batch_size"], c["in_channels"], c["height"], c["width"]), dt, seed,
                    **IMAGE)
        kw, kcb, kb = keys(KB, 3, seed)
        w = normal(kw, (c["out_channels"], c["in_channels"], k, k), dt, seed=seed, **WEIGHT)
        return x, w, bias(kcb, (c["out_channels"],), dt, seed), bias(kb, (c["out_channels"], 1, 1), dt, seed)

    def reference(self, config, x, w, conv_bias, bias):
        return to_channels_first(jax.nn.relu(conv_channels_last(x, w) + last(conv_bias, 2))) + bias


class Conv2dInstanceNormDivide(ConvWorkload):
    """22k conv2d_instancenorm_divide (KB L2 #17): InstanceNorm(conv(x, w) + conv_bias) / 2.

    Inputs: x (128,64,128,128) from K0; w (128,64,3,3), conv_bias (128,) N*0.02 from
    split(KB,2); in_weight = 1, in_bias = 0. InstanceNorm normalises over (H, W) per (n, c),
    eps 1e-5, biased variance with f32 accumulation (jnp.var), then the affine parameters;
    then / divide_by. Output (128,128,126,126). The flat kernel's block spans all of S (the
    statistics need the whole image); with layout=hwnc the kernel returns each image's sums
    and sums of squares with its bf16 output, and the glue normalises in one pass.

    Tolerance (workloads.md section 7): the bf16 reference carries its own rounding noise:
    the conv output is rounded to bf16 and the normalisation divides by the per-image std,
    amplifying that rounding. Measured max |ref_bf16 - ref_f32| (same bf16 inputs, the
    reference run in f32): 3.6e-2 at full spatial size (first 4 samples of the spec's
    inputs), 2.2-2.5e-2 at check size, so a correct kernel computing in f32 can fail
    1e-2/1e-2 against the bf16 reference. Like every KernelBench workload, the check
    compares with the float32 reference and widens the tolerance just as far as the bf16
    reference's own error needs (``judge.expected``): about 5x here. The output has std
    0.5 and reaches +-2.3, so a zero output, a constant or the un-normalised conv still fail.
    Check size: batch 2, 20x20. The check's seeds keep conv_bias at the spec's scale (0.02): it
    is constant over each image, so the norm subtracts it, and a larger one only adds bf16
    cancellation to the reference (its widening grew from ~4x to 7-14x at BIAS_SCALE).
    """

    name = "conv2d_instancenorm_divide"
    jaxbench_id = "22k"
    description = "conv2d 3x3, InstanceNorm2d, divide by 2 (KB L2 #17)"
    defaults = {"batch_size": 128, "in_channels": 64, "out_channels": 128, "kernel_size": 3, "divide_by": 2.0,
                "height": 128, "width": 128, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "height": 20, "width": 20}
    whole_s = True
    hwnc = True
    template_part = '''
SCHEDULE = {"block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem", "layout": "flat", "block_h": 2,
            "block_n": 32, "pack_w": 1}


def instance_norm_epilogue(acc, mask, conv_bias, in_weight, in_bias, *, eps, divide_by):
    y = acc + conv_bias
    d = y - masked_mean(y, mask)
    var = masked_mean(d * d, mask)
    return (d * jax.lax.rsqrt(var + eps) * in_weight + in_bias) / divide_by


def conv_only_epilogue(acc, mask):
    return acc  # conv_bias is constant over each image: the norm subtracts it


def workload(x, w, conv_bias, in_weight, in_bias):
    s = SCHEDULE
    if s["layout"] == "hwnc":  # (Ho, Wo, N, C) in bf16 and the kernel's per-image sums: the glue reads y once
        f32 = jnp.float32
        y, sums = conv2d_hwnc(x, w, (), conv_only_epilogue, block_h=s["block_h"], block_n=s["block_n"],
                              pack=s["pack_w"], channels_first=False, stats=True)
        mean, var = moments(sums, y.shape[0] * y.shape[1])  # per image and channel
        scale = in_weight.astype(f32) * jax.lax.rsqrt(var + 1e-5) / CONFIG["divide_by"]
        out = (y.astype(f32) - mean) * scale + in_bias.astype(f32) / CONFIG["divide_by"]
        return jnp.transpose(out.astype(x.dtype), (2, 3, 0, 1))
    epilogue = functools.partial(instance_norm_epilogue, eps=1e-5, divide_by=float(CONFIG["divide_by"]))
    return conv_nd(x, tap_major(w), w.shape[2:], (column(conv_bias), column(in_weight), column(in_bias)), epilogue,
                   block_s=None, **flat_knobs(s))
'''

    def validate_shapes(self, config):
        super().validate_shapes(config)
        if not isinstance(config["divide_by"], (int, float)) or config["divide_by"] == 0:
            raise ValueError(f"{self.name}: divide_by must be a non-zero number, got {config['divide_by']!r}")

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        x = uniform(jax.random.key(K0 + seed), (c["batch_size"], c["in_channels"], c["height"], c["width"]), dt,
                    seed, **IMAGE)
        kw, kcb = keys(KB, 2, seed)
        w = normal(kw, (co, c["in_channels"], k, k), dt, seed=seed, **WEIGHT)
        return (x, w, bias(kcb, (co,), dt, seed, check_scale=0.02),
                constant("ones", (co,), dt, seed, side_key(KB, seed, "in_weight")),
                constant("zeros", (co,), dt, seed, side_key(KB, seed, "in_bias")))

    def reference(self, config, x, w, conv_bias, in_weight, in_bias):
        y = to_channels_first(conv_channels_last(x, w) + last(conv_bias, 2))
        mean = jnp.mean(y, axis=(2, 3), keepdims=True)
        var = jnp.var(y, axis=(2, 3), keepdims=True)
        y = (y - mean) / jnp.sqrt(var + EPS) * channel(in_weight, 2) + channel(in_bias, 2)
        return y / config["divide_by"]

    def essential_work(self, config):
        # conv_bias is constant over each (n, c) image, so the InstanceNorm subtracts it: not read.
        nbytes, flops = super().essential_work(config)
        return nbytes - config["out_channels"] * self.dt(config).itemsize, flops


class Conv3dGroupNormMean(ConvWorkload):
    """25k conv3d_groupnorm_mean (KB L2 #23): mean over (C,D,H,W) of GroupNorm(conv3d(x) + b).

    Inputs: x (128,3,24,32,32); w (24,3,3,3,3), conv_bias, beta (24,) N*0.02 from
    split(K42,3); gamma. GroupNorm: 8 groups of 3 channels, statistics over (channels in
    group, D, H, W), eps 1e-5, f32 accumulation. Output (128,), tolerance 1e-2/1e-2.

    Input fix (workloads.md section 5): with gamma = 1 the output is exactly mean(beta) for
    every row, independent of x and the conv (-0.005 in f32: an all-zero output passed).
    Two minimal changes, math and shapes kept:
    * gamma ~ N(0,1) from fold_in(key(42 + seed), 3) instead of ones: the output becomes
      mean(beta) + mean_c gamma_c (mu_c - mu_group)/sigma_group, which depends on the conv;
    * x = U[0,1) (from K0, as before) times a per-sample scale U[0.2, 2) from
      fold_in(key(0 + seed), 1): with iid U[0,1) images every sample's statistics agree to
      ~1e-3, so a constant vector over the batch would pass; the scale changes the balance of
      conv_bias against the conv in each sample's normalised output.
    Measured at full size (seed 0, bf16): outputs in [-0.238, -0.144] (std 0.024) instead of
    mean(beta) = -0.011 everywhere; the all-zero output misses by up to 0.24 (19x the
    allowance), the batch-mean constant by 0.077 (6x); the bf16 reference's own noise is
    1.2e-3.
    The kernel's block spans all of S (one grid step per sample reduces the whole volume).
    Knob ``epilogue``: "tile" (the normalised tile summed) or "sums" (the same mean from each
    channel's sums of y and y*y: exact up to rounding, with the variance as E[y^2] - mean^2).
    Check size: batch 8 (so "constant over the batch" is meaningful), 8x10x10.
    """

    name = "conv3d_groupnorm_mean"
    jaxbench_id = "25k"
    group_key = "num_groups"
    category = "conv+norm+reduction"
    description = "conv3d 3x3x3, GroupNorm(8), mean over C,D,H,W (KB L2 #23)"
    spatial = ("depth", "height", "width")
    channel_keys = ConvWorkload.channel_keys + ("num_groups",)
    defaults = {"batch_size": 128, "in_channels": 3, "out_channels": 24, "kernel_size": 3, "num_groups": 8,
                "depth": 24, "height": 32, "width": 32, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 8, "depth": 8, "height": 10, "width": 10}
    whole_s = True
    reduce_s = True
    template_part = '''
SCHEDULE = {"block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem", "pad_cin": 1, "epilogue": "tile"}


def group_norm_mean_epilogue(acc, mask, conv_bias, groups, gamma, beta, *, group_size, eps):
    z = group_norm(acc + conv_bias, mask, groups, group_size, eps) * gamma + beta
    return jnp.sum(jnp.sum(z * mask, axis=1, keepdims=True), axis=0, keepdims=True)


def group_sums_mean_epilogue(acc, mask, conv_bias, groups, gamma, beta, *, group_size, eps):
    """The same sum from each channel's sums of y and y*y alone: a normalised channel sums to
    gamma (sum y - n mean_group) / sigma_group + n beta. The sums by the MXU, of bf16 values
    (the reference's conv output is bf16)."""
    y = acc + conv_bias
    m = jnp.broadcast_to(mask, (8, mask.shape[1])).astype(jnp.bfloat16)

    def column_sums(v):
        return jax.lax.dot_general(v.astype(jnp.bfloat16), m, (((1,), (1,)), ((), ())),
                                   preferred_element_type=jnp.float32)[:, :1]

    n = jnp.sum(mask)
    s1, s2 = column_sums(y), column_sums(y * y)
    mean = group_sum(groups, s1) / (group_size * n)
    var = jnp.maximum(group_sum(groups, s2) / (group_size * n) - mean * mean, 0.0)
    z = gamma * (s1 - n * mean) * jax.lax.rsqrt(var + eps) + n * beta
    return jnp.sum(z, axis=0, keepdims=True)


def workload(x, w, conv_bias, gamma, beta):
    s = SCHEDULE
    c = w.shape[0]
    epilogue = group_sums_mean_epilogue if s["epilogue"] == "sums" else group_norm_mean_epilogue
    epilogue = functools.partial(epilogue, group_size=c // CONFIG["num_groups"], eps=1e-5)
    params = (column(conv_bias), group_matrix(c, CONFIG["num_groups"]), column(gamma), column(beta))
    sums = conv_nd(x, tap_major(w), w.shape[2:], params, epilogue, block_s=None, out_rows=1, reduce=True,
                   **flat_knobs(s))
    volume = math.prod(d - k + 1 for d, k in zip(x.shape[2:], w.shape[2:]))
    return (sums[:, 0] / (c * volume)).astype(x.dtype)
'''

    def own_knobs(self, config):
        return [Knob("epilogue", ("tile", "sums"), "tile", "tile: the group norm applied to the output tile, then "
                     "summed; sums: the same mean from each channel's sums of y and y*y (by the MXU), no tile")]

    def out_rows(self, config):
        return 1


    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co, n = c["kernel_size"], c["out_channels"], c["batch_size"]
        kx = jax.random.key(K0 + seed)
        x = uniform(kx, (n, c["in_channels"], c["depth"], c["height"], c["width"]), dt, seed, **IMAGE)
        scale = jax.random.uniform(jax.random.fold_in(kx, 1), (n, 1, 1, 1, 1), dt, 0.2, 2.0)
        kw, kcb, kbeta = keys(K42, 3, seed)
        w = normal(kw, (co, c["in_channels"], k, k, k), dt, seed=seed, **WEIGHT)
        gamma = bias(jax.random.fold_in(jax.random.key(K42 + seed), 3), (co,), dt, seed, scale=1.0)
        return x * scale, w, bias(kcb, (co,), dt, seed), gamma, bias(kbeta, (co,), dt, seed)

    def reference(self, config, x, w, conv_bias, gamma, beta):
        y = to_channels_first(conv_channels_last(x, w) + last(conv_bias, 3))
        n, c, d, h, wd = y.shape
        groups = config["num_groups"]
        g = y.reshape(n, groups, c // groups, d, h, wd)
        mean = jnp.mean(g, axis=(2, 3, 4, 5), keepdims=True)
        var = jnp.var(g, axis=(2, 3, 4, 5), keepdims=True)
        y = ((g - mean) / jnp.sqrt(var + EPS)).reshape(y.shape) * channel(gamma, 3) + channel(beta, 3)
        return jnp.mean(y, axis=(1, 2, 3, 4))


class ConvTranspose3dLayerNormGeluScaling(ConvWorkload):
    """28k convtranspose3d_layernorm_gelu_scaling (KB L2 #34).

    Inputs: split(K0,2) -> x (32,32,16,32,32) U[0,1), w (in 32, out 64, 4,4,4) N(0,1)
    unscaled (IODHW); conv_bias = 0, ln_weight = 1, ln_bias = 0, all (out_channels,).
    Math: ConvTranspose3d (stride 2, padding 1, kernel 4), + conv_bias; LayerNorm over the
    LAST axis (W_out = 64), eps 1e-5, variance in the input dtype; ln_weight/ln_bias
    broadcast along W_out, which works only because 2*width == out_channels (workloads.md
    section 7: other sizes raise ValueError); gelu (tanh), times scaling_factor. Output (32,64,32,64,64), tolerance 5e-2/1e-2.
    The reference is JAXBench's program: channels-last, the zero-inserted input materialised
    in HBM (a zero array of (2*16-1, 2*32-1, 2*32-1) positions with the input set at every
    second one), a stride-1 conv with the flipped kernel padded by k-1-padding = 2, + conv_bias,
    back to channels-first, then the norm. Passing the zero insertion to the conv as
    ``lhs_dilation`` instead (no zeros in HBM, no layout transposes) computes the same values
    and is predicted 1.7x faster: a candidate, not the baseline.

    Template: the sub-pixel decomposition. Output position 2m + p (parity p per dim) reads
    input positions m-1..m+1 (the input padded by 1) through kernel taps 3 - 2t + p (t the
    window offset; taps outside 0..3 are zero). So one 3x3x3 patch matrix of the padded input
    (KC = 32*27) times a stacked weight (8 parities * 64 rows) gives every output parity; the
    glue applies the LayerNorm over W (its axis mixes parities, so it is outside the kernel
    here), gelu and scaling with the parities still apart, then interleaves them with two
    0/1 contractions. The zero-inserted input's patches would need 17 GiB. That glue
    dominates the predicted time (14.9 of 15.7 ms at full size, 2026-12-06: the crop of the
    kernel's wrap-around columns into 34-wide minor axes and the moves between layouts with
    32- or 34-wide minor axes cost GBs of padded traffic; interleaving the parities first,
    with a transpose, and normalising after cost 16.4 ms), which the ncdhw layout removes.
    Knob ``layout`` (bf16): "flat" (the above) or "ncdhw": a kernel of its own writes the final
    NCDHW output with the LayerNorm over W, gelu and scaling fused. The W axis's transposed
    conv is a banded weight matrix per (depth, height) parity, rows (2 window rows per dim,
    input column, cin), columns (cout, output column), so each dot gives output rows with their
    width parities interleaved; it runs per half of the output's columns (the band's zeros a
    third fewer), and a 0/1 placement joins the halves. The conv output is rounded to bf16
    once, with its bias (a second rounding, or the LayerNorm in bf16 as the reference's,
    took the check's worst output from 0.3 to 0.5-0.7 of its tolerance: rows of small
    variance magnify any rounding). At full size 3.15 ms (4.09x over XLA) at block_co=16
    (2026-12-07).
    ``block_co``: output channels per grid step.
    Check size: batch 2, 8x8x32 (width stays 32: W_out must equal out_channels; depth 8, so
    that the default block_s = 2048 leaves two grid steps over a sample's padded 10x10x34
    positions, where depth 4 left one and every reset of the default climbed a rung).
    """

    name = "convtranspose3d_layernorm_gelu_scaling"
    jaxbench_id = "28k"
    category = "conv-transpose+norm"
    description = "ConvTranspose3d (stride 2), LayerNorm over W, gelu, scaling (KB L2 #34)"
    spatial = ("depth", "height", "width")
    channel_keys = ConvWorkload.channel_keys + ("stride", "padding")
    defaults = {"batch_size": 32, "in_channels": 32, "out_channels": 64, "kernel_size": 4, "stride": 2,
                "padding": 1, "bias": True, "eps": 1e-5, "scaling_factor": 1.0,
                "depth": 16, "height": 32, "width": 32, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "depth": 8, "height": 8}
    atol = 5e-2
    template_part = '''
SCHEDULE = {"block_s": 2048, "block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem",
            "layout": "flat", "block_co": 8}


def subpixel_weight(w):
    """(Cin, Cout, 4, 4, 4) ConvTranspose weight -> (8*Cout, 27*Cin): rows (pd, ph, pw, cout)
    = output parities, columns (td, th, tw, cin) = 3x3x3 window offsets on the input padded by 1."""
    p, t, k = np.arange(2)[:, None, None], np.arange(3)[None, :, None], np.arange(4)[None, None, :]
    pick = jnp.asarray((k == 3 - 2 * t + p).astype(np.float32))  # (parity, offset, tap)
    big = jnp.einsum("ioabc,xta,yub,zvc->xyzotuvi", w.astype(jnp.float32), pick, pick, pick,
                     precision=jax.lax.Precision.HIGHEST)
    return big.reshape(8 * w.shape[1], -1).astype(w.dtype)


def bias_epilogue(acc, mask, bias):
    return acc + bias


def half_positions(width, cin):
    """Input columns each half of the output's columns reads, padded so the window is whole lanes."""
    return round_up((width // 2 + 2) * cin, 128) // cin


def ncdhw_weights(w, width):
    """(Cin, Cout, 4, 4, 4) ConvTranspose weight -> (4, 4*P*Cin, Cout*Wi): one matrix per output
    parity (pd, ph), the same for both halves of the output's columns (the band is translation
    invariant). Rows (a, b, j, cin): the parity's two input rows per dim (window offsets pd + a
    and ph + b on the input padded by 1, taps 3 - pd - 2a and 3 - ph - 2b), then the half's P
    input columns (j) and the channels; columns (cout, Wl): the half's output columns, tap
    Wl - 2 j + 3."""
    cin, cout = w.shape[:2]
    pos = half_positions(width, cin)
    taps = np.array([[3, 1], [2, 0]])  # [parity, a]
    wsel = w[:, :, taps][:, :, :, :, taps].transpose(2, 4, 3, 5, 0, 6, 1)  # (pd, ph, a, b, cin, kw, cout)
    wsel = jnp.repeat(wsel, width, axis=-1).reshape(4, 2, 2, 1, cin, 4, cout * width)
    shape = (pos, 1, 4, cout * width)  # (j, ., kw, (cout, Wl))
    col, j, kw = (jax.lax.broadcasted_iota(jnp.int32, shape, axis) for axis in (3, 0, 2))
    # One term per entry: exact. (As a product with a 0/1 band, XLA:CPU summed it wrongly under jit.)
    t = jnp.sum(jnp.where(col % width - 2 * j + 3 == kw, wsel, 0), axis=5)
    return t.reshape(4, 4 * pos * cin, cout * width)


def bf16_words(v):
    """bf16 values as the high halves of uint32 words (low halves zero)."""
    return jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)


def ncdhw_kernel(x_ref, t_ref, b_ref, p_ref, g_ref, lw_ref, lb_ref, o_ref, *, depth, height, wo, half_step,
                 half_lanes, eps, scale):
    """One sample, block_co output channels. Per output parity (pd, ph) and half of the output's
    columns, one dot of the sample's (d, h) rows (the half's input window) with the parity's
    banded weights gives that half of every output row; an exact 0/1 placement by the MXU joins
    the halves into whole (cout, W) rows. The LayerNorm over W, gelu and scaling follow, and the
    two height parities are packed into bf16 row pairs (row 2h + ph), the output's own tiling,
    so each (d, 2h, W) slab of a channel is stored as it lies in the NCDHW result."""
    row_lanes = x_ref.shape[-1] // 3  # one height offset's (column, channel) lanes
    n_half = t_ref.shape[-1]
    for pd in range(2):
        words = None
        for ph in range(2):
            halves = []
            for half in range(2):
                lo = half * half_step
                lhs = jnp.concatenate(
                    [x_ref[0, pd + a:pd + a + depth, :, (ph + b) * row_lanes + lo:(ph + b) * row_lanes + lo + half_lanes]
                     for a in range(2) for b in range(2)], axis=-1).reshape(depth * height, 4 * half_lanes)
                halves.append(jnp.dot(lhs, t_ref[2 * pd + ph], preferred_element_type=jnp.float32))
            # (cout, half) columns of both halves -> whole (cout, W) rows: a 0/1 placement by the
            # MXU of each f32 value's bf16 head and tail (exact to f32's last bits: rounding the
            # conv to bf16 before its bias, as two roundings, took half the check's margin)
            joined = []
            for k in range(0, n_half, 128):
                pair = jnp.concatenate([halves[0][:, k:k + 128], halves[1][:, k:k + 128]], axis=-1)
                head = pair.astype(jnp.bfloat16)
                tail = (pair - head.astype(jnp.float32)).astype(jnp.bfloat16)
                joined.append(jnp.dot(head, p_ref[...], preferred_element_type=jnp.float32)
                              + jnp.dot(tail, p_ref[...], preferred_element_type=jnp.float32))
            y = (jnp.concatenate(joined, axis=-1) + b_ref[...]).astype(jnp.bfloat16)
            n_cols = y.shape[-1]
            chunks = []
            for c in range(0, n_cols, 128):  # LayerNorm over each wo-lane segment: sums by the MXU
                yc = y[:, c:c + 128]
                mean = jnp.dot(yc, g_ref[...], preferred_element_type=jnp.float32)
                dev = yc.astype(jnp.float32) - mean
                var = jnp.dot((dev * dev).astype(jnp.bfloat16), g_ref[...], preferred_element_type=jnp.float32)
                z = dev * jax.lax.rsqrt(var + eps) * lw_ref[...].astype(jnp.float32) + lb_ref[...].astype(jnp.float32)
                chunks.append((jax.nn.gelu(z) * scale).astype(jnp.bfloat16))
            bits = bf16_words(jnp.concatenate(chunks, axis=-1))
            words = bits >> 16 if ph == 0 else words | bits  # row h of parity 0 in the low half
        rows = pltpu.bitcast(words, jnp.bfloat16).reshape(depth, 2 * height, n_cols)  # rows (d, 2h + ph)
        for co in range(n_cols // wo):
            o_ref[0, co, :, pd] = rows[:, :, co * wo:(co + 1) * wo]


def ncdhw_workload(x, w, conv_bias, ln_weight, ln_bias):
    n, cin, d, h, wd = x.shape
    co, wo = w.shape[1], 2 * wd
    cb = SCHEDULE["block_co"]
    pos = half_positions(wd, cin)
    # (n, d+2, h, (th, column, cin)): columns and channels in the lanes, the columns padded by one
    # before and enough after for the second half's window; three row offsets side by side.
    xt = jax.lax.reshape(x, (n, d, h, wd * cin), dimensions=(0, 2, 3, 4, 1))
    xt = jnp.pad(xt, ((0, 0), (1, 1), (1, 1), (cin, (wd // 2 + pos - wd - 1) * cin)))
    xs = jnp.concatenate([xt[:, :, t:t + h] for t in range(3)], axis=-1)
    t = ncdhw_weights(w, wd)
    bias = jnp.repeat(conv_bias.astype(jnp.float32), wo).reshape(1, co * wo)
    s, dst = jax.lax.broadcasted_iota(jnp.int32, (256, 256), 0), jax.lax.broadcasted_iota(jnp.int32, (256, 256), 1)
    place = (dst == (s % 128) // wd * wo + s // 128 * wd + s % wd).astype(jnp.bfloat16)
    lane = jax.lax.broadcasted_iota(jnp.int32, (128, 128), 0), jax.lax.broadcasted_iota(jnp.int32, (128, 128), 1)
    g = ((lane[0] // wo == lane[1] // wo).astype(jnp.float32) / wo).astype(jnp.bfloat16)  # segment means
    lw = jnp.tile(ln_weight, 128 // wo).reshape(1, 128)
    lb = jnp.tile(ln_bias, 128 // wo).reshape(1, 128)
    kernel = functools.partial(ncdhw_kernel, depth=d, height=h, wo=wo, half_step=wd // 2 * cin,
                               half_lanes=pos * cin, eps=CONFIG["eps"], scale=CONFIG["scaling_factor"])
    return pl.pallas_call(
        kernel,
        grid=(co // cb, n),
        in_specs=[
            pl.BlockSpec((1, d + 2, h, xs.shape[-1]), lambda c, i: (i, 0, 0, 0)),
            pl.BlockSpec((4, 4 * pos * cin, cb * wd), lambda c, i: (0, 0, c)),
            pl.BlockSpec((1, cb * wo), lambda c, i: (0, c)),
            pl.BlockSpec((256, 256), lambda c, i: (0, 0)),
            pl.BlockSpec((128, 128), lambda c, i: (0, 0)),
            pl.BlockSpec((1, 128), lambda c, i: (0, 0)),
            pl.BlockSpec((1, 128), lambda c, i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((1, cb, d, 2, 2 * h, wo), lambda c, i: (i, c, 0, 0, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((n, co, d, 2, 2 * h, wo), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(xs, t, bias, place, g, lw, lb).reshape(n, co, 2 * d, 2 * h, wo)  # (d, pd) -> 2d + pd: free


def workload(x, w, conv_bias, ln_weight, ln_bias):
    s = SCHEDULE
    if s["layout"] == "ncdhw":
        return ncdhw_workload(x, w, conv_bias, ln_weight, ln_bias)
    n, _, d, h, wd = x.shape
    co = w.shape[1]
    xp = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    y = conv_nd(xp, subpixel_weight(w), (3, 3, 3), (column(jnp.tile(conv_bias, 8)),), bias_epilogue, **flat_knobs(s))
    # (n, pd, ph, pw, co, d, h, w): the LayerNorm over W_out = (w, pw) runs before the parities
    # are interleaved, with ln_weight/ln_bias (indexed by 2w + pw) laid out as (pw, w).
    y = y.reshape(n, 2, 2, 2, co, d, h, wd).astype(jnp.float32)
    mean = jnp.mean(y, axis=(3, 7), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(3, 7), keepdims=True)
    by_parity = lambda v: v.astype(jnp.float32).reshape(wd, 2).T.reshape(1, 1, 1, 2, 1, 1, 1, wd)
    y = (y - mean) * jax.lax.rsqrt(var + CONFIG["eps"]) * by_parity(ln_weight) + by_parity(ln_bias)
    y = (jax.nn.gelu(y) * CONFIG["scaling_factor"]).astype(x.dtype)
    # The interleave as two 0/1 contractions (exact: one term each): out index 2i + p. Built
    # from iotas, so the program is the same at every size.
    def spread(m):
        p, i, o = (jax.lax.broadcasted_iota(jnp.int32, (2, m, 2 * m), axis) for axis in range(3))
        return (o == 2 * i + p).astype(x.dtype)

    y = jnp.einsum("nabcodhw,cwx,bhy->nodayx", y, spread(wd), spread(h), preferred_element_type=jnp.float32)
    return y.astype(x.dtype).reshape(n, co, 2 * d, 2 * h, 2 * wd)
'''

    def own_knobs(self, config):
        if config["dtype"] != "bfloat16":  # the kernel packs its output's row pairs as bf16
            return []
        return [Knob("layout", ("flat", "ncdhw"), "flat", "flat: the family's im2col kernel, the LayerNorm and "
                     "the parity interleave in XLA glue; ncdhw: a kernel writing the final NCDHW output, a banded "
                     "weight matrix per parity, the LayerNorm fused (block_s, block_k, buffers, patches, "
                     "accumulator unused)"),
                Knob("block_co", (4, 8, 16), 8, "layout=ncdhw: output channels per grid step")]

    def ncdhw_vmem_bytes(self, config, s) -> int:
        """Estimated scoped VMEM of the ncdhw kernel: double-buffered input sample, band matrices and
        output block, one parity's stacked rows and its f32 temporaries."""
        c, dt = config, config["dtype"]
        cin, wd, cb = c["in_channels"], c["width"], s["block_co"]
        pos = self.half_window(config)
        window = pos * cin  # lanes of one half's input window
        rows = c["depth"] * c["height"]
        return 2 * (tile_bytes(((c["depth"] + 2) * c["height"], 3 * (wd // 2 + pos) * cin), dt)
                    + 4 * tile_bytes((4 * window, cb * wd), dt)
                    + tile_bytes((cb * 2 * c["depth"] * 2 * c["height"], 2 * wd), dt)) \
            + tile_bytes((rows, 4 * window), dt) + EPILOGUE_TEMPS * tile_bytes((rows, 2 * cb * wd), "float32")

    def half_window(self, config) -> int:
        """Input columns one half of the output's columns reads (``half_positions`` in the template)."""
        return round_up((config["width"] // 2 + 2) * config["in_channels"], 128) // config["in_channels"]

    def layout_check(self, config, s):
        wd, cin, cb = config["width"], config["in_channels"], s["block_co"]
        if config["out_channels"] % cb or 128 % wd or cb * wd % 128:
            return (f"layout=ncdhw: block_co={cb} must divide out_channels={config['out_channels']}, and the "
                    f"{wd}-wide halves of the output rows tile 128 lanes")
        if wd % 2 or wd // 2 * cin % 128:
            return f"layout=ncdhw: each half's input window must start on whole lanes ({wd // 2} x {cin} channels)"
        return over_vmem(self.ncdhw_vmem_bytes(config, s), VMEM_LIMIT)

    def validate_shapes(self, config):
        c = config
        if (c["kernel_size"], c["stride"], c["padding"]) != (4, 2, 1):
            raise ValueError(f"{self.name}: only kernel_size=4, stride=2, padding=1 are supported, got "
                             f"{c['kernel_size']}, {c['stride']}, {c['padding']}")
        if c["bias"] is not True:
            raise ValueError(f"{self.name}: only bias=True is supported (conv_bias is an input)")
        if 2 * c["width"] != c["out_channels"]:
            raise ValueError(f"{self.name}: ln_weight/ln_bias have out_channels={c['out_channels']} entries but "
                             f"broadcast along W_out = 2*width = {2 * c['width']}; they must be equal")
        if not c["eps"] > 0:
            raise ValueError(f"{self.name}: eps must be positive, got {c['eps']!r}")

    def out_spatial(self, config):
        return tuple(2 * config[key] for key in self.spatial)

    def window(self, config):
        return [config[key] + 2 for key in self.spatial], 3  # 3x3x3 windows on the input padded by 1

    def matmul_rows(self, config):
        return 8 * config["out_channels"]  # one row block per output parity

    def out_rows(self, config):
        return self.matmul_rows(config)

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        kx, kw = keys(K0, 2, seed)
        x = uniform(kx, (c["batch_size"], c["in_channels"], c["depth"], c["height"], c["width"]), dt, seed, **IMAGE)
        w = normal(kw, (c["in_channels"], co, k, k, k), dt, scale=1.0, seed=seed, **WEIGHT)  # rows: input channels
        return (x, w, *(constant(init, (co,), dt, seed, side_key(K0, seed, name)) for init, name in
                        (("zeros", "conv_bias"), ("ones", "ln_weight"), ("zeros", "ln_bias"))))

    def reference(self, config, x, w, conv_bias, ln_weight, ln_bias):
        k, s, p = config["kernel_size"], config["stride"], config["padding"]
        xl = jnp.transpose(x, (0, 2, 3, 4, 1))  # N D H W Cin
        kernel = jnp.flip(jnp.transpose(w, (2, 3, 4, 1, 0)), axis=(0, 1, 2))  # kd kh kw Cout Cin, flipped
        n, d, h, wd, cin = xl.shape
        zero_inserted = jnp.zeros((n, (d - 1) * s + 1, (h - 1) * s + 1, (wd - 1) * s + 1, cin), xl.dtype)
        zero_inserted = zero_inserted.at[:, ::s, ::s, ::s, :].set(xl)
        e = k - 1 - p
        y = lax.conv_general_dilated(zero_inserted, kernel, (1, 1, 1), ((e, e),) * 3,
                                     dimension_numbers=("NDHWC", "DHWOI", "NDHWC"))
        y = to_channels_first(y + last(conv_bias, 3))
        mean = jnp.mean(y, axis=-1, keepdims=True)
        var = jnp.mean((y - mean) ** 2, axis=-1, keepdims=True)
        y = (y - mean) / jnp.sqrt(var + config["eps"]) * ln_weight + ln_bias
        return jax.nn.gelu(y) * config["scaling_factor"]

    def essential_work(self, config):
        # The reference's conv runs over the zero-inserted input; only the (input, tap) products
        # that land inside the output count: per dim, sum_i,t [0 <= s i - p + t < out].
        k, s, p = config["kernel_size"], config["stride"], config["padding"]
        taps = 1
        for key in self.spatial:
            n = config[key]
            out = (n - 1) * s - 2 * p + k
            taps *= sum(0 <= s * i - p + t < out for i in range(n) for t in range(k))
        macs = config["batch_size"] * config["in_channels"] * config["out_channels"] * taps
        return float(io_bytes(self, config)), 2.0 * macs


class Conv3dMishTanh(ConvWorkload):
    """33k conv3d_mish_tanh (KB L2 #47): tanh(mish(conv3d(x, w) + b)), softplus as log(1 + e^v).

    Inputs: x (16,32,32,64,64) from K0; w (64,32,3,3,3), b (64,) N*0.02 from split(KB,2).
    Output (16,64,30,62,62), tolerance 1e-2/1e-2. Tile-local epilogue.
    Check size: batch 2, 6x18x18 (S = 1024).
    """

    name = "conv3d_mish_tanh"
    jaxbench_id = "33k"
    description = "conv3d 3x3x3, mish, tanh (KB L2 #47)"
    spatial = ("depth", "height", "width")
    defaults = {"batch_size": 16, "in_channels": 32, "out_channels": 64, "kernel_size": 3,
                "depth": 32, "height": 64, "width": 64, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "depth": 6, "height": 18, "width": 18}
    template_part = '''
SCHEDULE = {"block_s": 2048, "block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem"}


def mish_tanh_epilogue(acc, mask, bias):
    v = acc + bias
    softplus = jnp.maximum(v, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(v)))  # log(1 + e^v), overflow-free
    return jnp.tanh(v * jnp.tanh(softplus))


def workload(x, w, b):
    s = SCHEDULE
    return conv_nd(x, tap_major(w), w.shape[2:], (column(b),), mish_tanh_epilogue, **flat_knobs(s))
'''

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        x = uniform(jax.random.key(K0 + seed), (c["batch_size"], c["in_channels"], c["depth"], c["height"],
                                               c["width"]), dt, seed, **IMAGE)
        kw, kb = keys(KB, 2, seed)
        return x, normal(kw, (co, c["in_channels"], k, k, k), dt, seed=seed, **WEIGHT), bias(kb, (co,), dt, seed)

    def reference(self, config, x, w, b):
        v = conv_channels_last(x, w, padding=((0, 0),) * 3) + last(b, 3)
        return to_channels_first(jnp.tanh(v * jnp.tanh(jnp.log(1 + jnp.exp(v)))))


class Conv2dActivationBatchNorm(ConvWorkload):
    """34k conv2d_activation_batchnorm (KB L2 #52): BatchNorm2d(mish(conv(x, w) + conv_bias)).

    Inputs: split(K0,3) -> x (64,64,128,128), w (128,64,3,3) N(0,1) and conv_bias (128,)
    N(0,1), both unscaled; bn_weight = 1, bn_bias = 0. mish = v * tanh(softplus(v)).
    BatchNorm in training mode: statistics over (N, H, W) per channel, eps 1e-5, variance in
    the input dtype. Output (64,128,126,126), tolerance 1e-1/1e-2. The kernel fuses bias and
    mish; the cross-batch statistics are XLA glue after it, over the output (flat) or from
    the kernel's per-sample sums (layout=hwnc: one pass over the output).
    Check size: batch 4 (batch statistics over more than one sample), 20x20.

    Tolerance: with unscaled weights the conv output is ~N(+-12, 7) per channel, and the
    bf16 reference rounds it to bf16 (abs error ~0.03 at |v| ~ 10). In channels whose values
    are mostly negative, mish(v) ~ v*e^v turns that into a ~3% relative error, which the
    BatchNorm keeps while scaling those channels' rare large values up to z ~ 36. Measured
    max |ref_bf16 - ref_f32| (same bf16 inputs): 0.31 at check size, 0.89 at 8x64x64: a
    correct f32 kernel fails 1e-1/1e-2 against the bf16 reference (the template did, on
    1 value). The check's float32 comparison widens the tolerance as far as that noise
    needs (``judge.expected``).
    """

    name = "conv2d_activation_batchnorm"
    jaxbench_id = "34k"
    category = "conv+norm"
    description = "conv2d 3x3, mish, BatchNorm2d training mode (KB L2 #52)"
    defaults = {"batch_size": 64, "in_channels": 64, "out_channels": 128, "kernel_size": 3,
                "height": 128, "width": 128, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 4, "height": 20, "width": 20}
    atol = 1e-1
    hwnc = True
    template_part = '''
SCHEDULE = {"block_s": 2048, "block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem", "layout": "flat",
            "block_h": 2, "block_n": 32, "pack_w": 1}


def mish_epilogue(acc, mask, conv_bias):
    v = acc + conv_bias
    softplus = jnp.maximum(v, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(v)))
    return v * jnp.tanh(softplus)


def workload(x, w, conv_bias, bn_weight, bn_bias):
    s = SCHEDULE
    f32 = jnp.float32
    if s["layout"] == "hwnc":  # (Ho, Wo, N, C) and the kernel's sums: the glue reads y once
        y, sums = conv2d_hwnc(x, w, (row(conv_bias),), mish_epilogue, block_h=s["block_h"], block_n=s["block_n"],
                              pack=s["pack_w"], channels_first=False, stats=True)
        mean, var = moments(jnp.sum(sums, axis=1), y.shape[0] * y.shape[1] * y.shape[2])  # per channel
        out = (y.astype(f32) - mean) * (bn_weight.astype(f32) * jax.lax.rsqrt(var + 1e-5)) + bn_bias.astype(f32)
        return jnp.transpose(out.astype(x.dtype), (2, 3, 0, 1))
    y = conv_nd(x, tap_major(w), w.shape[2:], (column(conv_bias),), mish_epilogue, **flat_knobs(s)).astype(f32)
    channel = (1, -1, 1, 1)
    mean = jnp.mean(y, axis=(0, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(0, 2, 3), keepdims=True)
    scale = bn_weight.astype(f32).reshape(channel) * jax.lax.rsqrt(var + 1e-5)
    return ((y - mean) * scale + bn_bias.astype(f32).reshape(channel)).astype(x.dtype)
'''

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        kx, kw, kb = keys(K0, 3, seed)
        x = uniform(kx, (c["batch_size"], c["in_channels"], c["height"], c["width"]), dt, seed, **IMAGE)
        w = normal(kw, (co, c["in_channels"], k, k), dt, scale=1.0, seed=seed, **WEIGHT)
        return (x, w, bias(kb, (co,), dt, seed, scale=1.0),
                constant("ones", (co,), dt, seed, side_key(K0, seed, "bn_weight")),
                constant("zeros", (co,), dt, seed, side_key(K0, seed, "bn_bias")))

    def reference(self, config, x, w, conv_bias, bn_weight, bn_bias):
        y = to_channels_first(conv_channels_last(x, w) + last(conv_bias, 2))
        y = jnp.tanh(jax.nn.softplus(y)) * y  # mish
        mean = jnp.mean(y, axis=(0, 2, 3), keepdims=True)
        var = jnp.mean((y - mean) ** 2, axis=(0, 2, 3), keepdims=True)
        return (y - mean) / jnp.sqrt(var + EPS) * channel(bn_weight, 2) + channel(bn_bias, 2)


class Conv2dGeluGlobalAvgPool(ConvWorkload):
    """39k conv2d_gelu_globalavgpool (KB L2 #67): mean over (H, W) of gelu(conv(x, w) + b).

    Inputs: x (128,8,256,256) from K0; w (64,8,3,3), b (64,) N*0.02 from split(KB,2).
    Output (128,64), tolerance 1e-2/1e-2. The kernel sums gelu over the S blocks of each
    sample (columns beyond S masked out) and the glue divides by S.
    Check size: batch 2, 32x128 (30 x 128 = 3840 wide positions: wrap-around columns and a
    padded last S block at most block_s values, both masked out of the sums; the width a
    multiple of 128 and the height of 16, so ``flatten=kernel`` is checked with its own rows).
    Knob ``epilogue`` (bf16 configs): "f32" (the bias, gelu and masked sum on the f32 dot) or
    "bf16" (gelu in bf16, the precision the reference computes it in, and the masked sum over
    the columns by the MXU, accumulated in f32): fewer vector ops per output where gelu over
    528M outputs is most of the kernel.
    """

    name = "conv2d_gelu_globalavgpool"
    jaxbench_id = "39k"
    category = "conv+pool"
    description = "conv2d 3x3, gelu, global average pool (KB L2 #67)"
    defaults = {"batch_size": 128, "in_channels": 8, "out_channels": 64, "kernel_size": 3,
                "height": 256, "width": 256, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "height": 32, "width": 128}
    reduce_s = True
    default_block_s = 8192
    template_part = '''
SCHEDULE = {"block_s": 8192, "block_k": 1024, "buffers": 2, "patches": "vmem", "accumulator": "vmem", "flatten": "xla",
            "epilogue": "f32"}


def gelu_sum_epilogue(acc, mask, bias):
    return jnp.sum(jax.nn.gelu(acc + bias) * mask, axis=1, keepdims=True)


def gelu_sum_epilogue_bf16(acc, mask, bias):
    g = jax.nn.gelu((acc + bias).astype(jnp.bfloat16))
    # The sum over the columns as a matmul with the mask's rows (contracting both tiles' columns).
    m = jnp.broadcast_to(mask, (8, mask.shape[1])).astype(jnp.bfloat16)
    return jax.lax.dot_general(g, m, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)[:, :1]


def workload(x, w, b):
    s = SCHEDULE
    epilogue = gelu_sum_epilogue_bf16 if s["epilogue"] == "bf16" else gelu_sum_epilogue
    sums = conv_nd(x, tap_major(w), w.shape[2:], (column(b),), epilogue, **flat_knobs(s), reduce=True)
    positions = math.prod(d - k + 1 for d, k in zip(x.shape[2:], w.shape[2:]))
    return (sums / positions).astype(x.dtype)
'''

    def own_knobs(self, config):
        flatten = Knob("flatten", ("xla", "kernel"), "xla", "where each sample's input becomes the flat rows the "
                       "taps slice: in XLA glue (a relayout copy and a pad), or by the kernel into f32 VMEM "
                       "(patches=vmem_im2col, width a multiple of 128, height of 16)")
        if config["dtype"] != "bfloat16":  # bf16 gelu is the reference's own precision only at bf16
            return [flatten]
        return [flatten, Knob("epilogue", ("f32", "bf16"), "f32", "f32: bias, gelu and the masked sum over "
                              "positions on the f32 dot; bf16: gelu in bf16 (as the reference), the masked sum by "
                              "the MXU (f32 accumulation)")]

    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        x = uniform(jax.random.key(K0 + seed), (c["batch_size"], c["in_channels"], c["height"], c["width"]), dt,
                    seed, **IMAGE)
        kw, kb = keys(KB, 2, seed)
        return x, normal(kw, (co, c["in_channels"], k, k), dt, seed=seed, **WEIGHT), bias(kb, (co,), dt, seed)

    def reference(self, config, x, w, b):
        # Pooled channels-last: (N, H, W, C) -> (N, C), never transposed back.
        return jnp.mean(jax.nn.gelu(conv_channels_last(x, w) + last(b, 2)), axis=(1, 2))


class Conv2dGroupNormTanhHardSwishResidualAddLogSumExp(ConvWorkload):
    """46k conv2d_groupnorm_tanh_hardswish_residualadd_logsumexp (KB L2 #92).

    Inputs: x (128,8,128,128) from K0; w (64,8,3,3), conv_bias (64,) N*0.02 from
    split(K42,2); gn_weight = 1, gn_bias = 0. Math: c = conv(x, w) + conv_bias; GroupNorm
    (16 groups of 4 channels, eps 1e-5, f32 accumulation); t = tanh; hs = t*clip(t+3,0,6)/6;
    out = logsumexp over channels of (c + hs), keepdims. Output (128,1,126,126), tolerance
    1e-2/1e-2. The kernel's block spans all of S (group statistics need the whole image) and
    the channel logsumexp collapses the tile to one row, so only (1, S) leaves VMEM.
    Check size: batch 2, 20x20.

    A weak but not vacuous check (not fixed: the spec lists no fix): the logsumexp over 64
    channels of small values sits near log(64) = 4.16; measured at full spatial size (first
    2 samples) the output spans [4.16, 4.44] with std 0.037, about one bf16 ulp (0.031 at
    4). A constant (the mean) fails on 8% of the entries (by up to 2.8x the allowance); the
    bf16 reference's own noise is 0.31 of the allowance (0.47 at check size).
    """

    name = "conv2d_groupnorm_tanh_hardswish_residualadd_logsumexp"
    jaxbench_id = "46k"
    group_key = "groups"
    category = "conv+norm+reduction"
    description = "conv2d 3x3, GroupNorm(16), tanh, hardswish, residual add, logsumexp over C (KB L2 #92)"
    channel_keys = ConvWorkload.channel_keys + ("groups",)
    defaults = {"batch_size": 128, "in_channels": 8, "out_channels": 64, "kernel_size": 3, "groups": 16,
                "height": 128, "width": 128, "dtype": "bfloat16"}
    check_overrides = {"batch_size": 2, "height": 20, "width": 20}
    whole_s = True
    default_patches = "hbm"
    template_part = '''
SCHEDULE = {"block_k": 1024, "buffers": 2, "patches": "hbm", "accumulator": "vmem"}


def norm_act_lse_epilogue(acc, mask, conv_bias, groups, gn_weight, gn_bias, *, group_size, eps):
    c = acc + conv_bias
    t = jnp.tanh(group_norm(c, mask, groups, group_size, eps) * gn_weight + gn_bias)
    r = c + t * jnp.clip(t + 3.0, 0.0, 6.0) / 6.0
    m = jnp.max(r, axis=0, keepdims=True)
    return m + jnp.log(jnp.sum(jnp.exp(r - m), axis=0, keepdims=True))


def workload(x, w, conv_bias, gn_weight, gn_bias):
    s = SCHEDULE
    c = w.shape[0]
    epilogue = functools.partial(norm_act_lse_epilogue, group_size=c // CONFIG["groups"], eps=1e-5)
    params = (column(conv_bias), group_matrix(c, CONFIG["groups"]), column(gn_weight), column(gn_bias))
    return conv_nd(x, tap_major(w), w.shape[2:], params, epilogue, block_s=None, **flat_knobs(s), out_rows=1)
'''

    def out_rows(self, config):
        return 1


    def make_inputs(self, config, seed):
        c, dt = config, self.dt(config)
        k, co = c["kernel_size"], c["out_channels"]
        x = uniform(jax.random.key(K0 + seed), (c["batch_size"], c["in_channels"], c["height"], c["width"]), dt,
                    seed, **IMAGE)
        kw, kcb = keys(K42, 2, seed)
        w = normal(kw, (co, c["in_channels"], k, k), dt, seed=seed, **WEIGHT)
        return (x, w, bias(kcb, (co,), dt, seed), constant("ones", (co,), dt, seed, side_key(K42, seed, "gn_weight")),
                constant("zeros", (co,), dt, seed, side_key(K42, seed, "gn_bias")))

    def reference(self, config, x, w, conv_bias, gn_weight, gn_bias):
        c = to_channels_first(conv_channels_last(x, w) + last(conv_bias, 2))
        n, ch, h, wd = c.shape
        groups = config["groups"]
        g = c.reshape(n, groups, ch // groups, h, wd)
        mean = jnp.mean(g, axis=(2, 3, 4), keepdims=True)
        var = jnp.var(g, axis=(2, 3, 4), keepdims=True)
        y = ((g - mean) / jnp.sqrt(var + EPS)).reshape(c.shape) * channel(gn_weight, 2) + channel(gn_bias, 2)
        t = jnp.tanh(y)
        hs = t * jnp.minimum(jnp.maximum(t + 3, 0), 6) / 6
        return jax.nn.logsumexp(c + hs, axis=1, keepdims=True)


CONV_WORKLOADS = (
    Conv2dReluBiasAdd, Conv2dInstanceNormDivide, Conv3dGroupNormMean, ConvTranspose3dLayerNormGeluScaling,
    Conv3dMishTanh, Conv2dActivationBatchNorm, Conv2dGeluGlobalAvgPool,
    Conv2dGroupNormTanhHardSwishResidualAddLogSumExp,
)
