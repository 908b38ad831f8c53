"""What the 8 KernelBench convolution workloads share: geometry, the references' convolution
(JAXBench's channels-last formulation), schedule space and template rendering.

Every template is the family's kernel module (``templates/conv_family.py``: an im2col matmul
with the workload's epilogue fused into the kernel) followed by the workload's own template part
(its SCHEDULE defaults, epilogue and ``workload(*inputs)`` glue), so the rendered source is
one standalone module. Knobs:

* ``block_s``: output positions (matmul columns) per grid step, for tile-local epilogues; the
  glue pads S up to a multiple of it. Workloads whose epilogue needs whole-image statistics
  (instance/group norm) have no such knob: their block spans all of S.
* ``block_k``: patch rows (contraction) per grid step; values at least the contraction
  length mean "all of it" (no padding); smaller ones must divide it padded to 128.
* ``buffers``: pipeline buffers of the weight and patch (or flat input) blocks.
* ``patches``: "hbm" (XLA writes the im2col patches, the kernel streams them), "vmem"
  (the kernel slices the taps from each sample's flat input held in VMEM, one dot per tap;
  ``block_k`` is then unused) or "vmem_im2col" (those slices stacked into one patch tile in
  VMEM and one dot: fewer, deeper MXU passes, most of all at few channels, 25k's 27 dots of
  depth 3 become one of depth 81; Mosaic stacks slices shorter than a sublane tile).
* ``accumulator`` (the matmuls' knob): "vmem" (the dot summed into an f32 VMEM scratch, which
  the epilogue reads back) or "none" (one K step: the dot's value goes straight to the
  epilogue; no scratch written and read per step). Neither always wins: on 39k's gelu and sum
  over 64 x 8192 tiles "none" saves a quarter of the kernel, on 33k it costs 2%.
* ``pad_cin`` (inputs whose channels are not a multiple of 8: 25k's 3): the input channels
  zero-padded, with the weights, to a multiple of 8, so each tap's slice is whole f32 sublane
  tiles (bf16 slices of fewer than 16 channels are stacked in f32) and flattening and padding
  the input are one pad: on 25k the kernel went from 0.61 to 0.33 ms, the glue 0.05 to 0.06 ms.
* ``flatten`` (39k): "xla" (the glue's relayout copy and pad make each sample's flat rows) or
  "kernel" (the kernel reads the NCHW input and writes its rows into f32 VMEM at the sample's
  first step; patches=vmem_im2col, width a multiple of 128): 39k's 0.39 ms of glue gone.
* ``layout`` (2-D convs whose epilogue is elementwise or a norm over the sums it can emit:
  18k, 22k, 34k): "flat" (the above) or
  "hwnc" (``conv2d_hwnc``: the output in the TPU's device layout of the NCHW result, no
  relayout copy; block_s, block_k, buffers, patches and accumulator unused), with ``block_h`` output rows per grid
  step, ``block_n`` samples per iteration of its loop and ``pack_w`` adjacent columns per
  matmul row.
  28k's own "ncdhw" (its own kernel, not the family's: the output written in its final
  NCDHW layout with the LayerNorm over W fused) takes ``block_co`` output channels per step.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
from jax import lax

from .base import ACCUMULATOR, Knob, ScheduleSpace, over_vmem, tile_bytes, tile_rows
from .kernelbench import KernelBenchWorkload

# Must match VMEM_LIMIT in templates/conv_family.py (the kernel's vmem_limit_bytes).
VMEM_LIMIT = 100 * 2**20
BLOCKS_S = (256, 512, 1024, 2048, 4096, 8192)
BLOCKS_K = (128, 256, 512, 1024)
# f32 (rows, block_s) temporaries an epilogue keeps live next to the accumulator (estimate).
EPILOGUE_TEMPS = 3


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def conv_channels_last(x, w, padding="VALID"):
    """JAXBench's convolution: the NC(D)HW input and OI(D)HW weight are transposed to
    channels-last (N(D)HWC and (D)HWIO), then a stride-1 cross-correlation with default
    precision. The output stays channels-last (N(D)HWC); callers transpose it back where
    JAXBench does."""
    nd = x.ndim - 2
    spatial = "DHW"[-nd:]
    lhs = jnp.transpose(x, (0, *range(2, nd + 2), 1))
    rhs = jnp.transpose(w, (*range(2, nd + 2), 1, 0))
    return lax.conv_general_dilated(lhs, rhs, (1,) * nd, padding,
                                    dimension_numbers=(f"N{spatial}C", f"{spatial}IO", f"N{spatial}C"))


def to_channels_first(y):
    """N(D)HWC -> NC(D)HW."""
    return jnp.transpose(y, (0, y.ndim - 1, *range(1, y.ndim - 1)))


class ConvWorkload(KernelBenchWorkload):
    """A conv + epilogue workload. Subclasses set ``spatial`` (config keys of the input's
    spatial dims), ``template_part`` (the template's workload part), ``whole_s`` (epilogue needs all
    of S in one block), ``reduce_s`` (the kernel sums over S), ``default_block_s``/``_k``."""

    category = "conv"
    template_file = "conv_family.py"
    spatial: tuple[str, ...] = ("height", "width")
    channel_keys: tuple[str, ...] = ("batch_size", "in_channels", "out_channels", "kernel_size")
    template_part: str = ""
    whole_s = False
    reduce_s = False
    default_block_s = 2048
    default_block_k = 1024
    default_patches = "vmem"
    group_key: str | None = None  # config key of a GroupNorm's group count, if any
    hwnc = False  # a 2-D conv whose epilogue is elementwise, or a norm by the kernel's sums: "hwnc" serves it

    @property
    def dims(self):
        return self.channel_keys + self.spatial

    def validate_shapes(self, config):
        k = config["kernel_size"]
        for key in self.spatial:
            if config[key] < k:
                raise ValueError(f"{self.name}: {key}={config[key]} is smaller than kernel_size={k}")
        if self.group_key and config["out_channels"] % config[self.group_key]:
            raise ValueError(f"{self.name}: out_channels={config['out_channels']} must be a multiple of "
                             f"{self.group_key}={config[self.group_key]}")

    # --- geometry --------------------------------------------------------------------
    def out_spatial(self, config) -> tuple[int, ...]:
        return tuple(config[key] - config["kernel_size"] + 1 for key in self.spatial)

    def window(self, config) -> tuple[list[int], int]:
        """(spatial dims of the input the template's stride-1 conv slides over, window size)."""
        return [config[key] for key in self.spatial], config["kernel_size"]

    def matmul_rows(self, config) -> int:
        return config["out_channels"]

    def matmul_shape(self, config) -> tuple[int, int, int, int]:
        """(rows R, contraction KC, columns S, output rows) of the kernel's per-sample matmul.
        S counts the "wide" positions (output rows x the input's trailing extents), as the
        template's flat windows do."""
        dims, k = self.window(config)
        kc = config["in_channels"] * k ** len(dims)
        wide = (dims[0] - k + 1) * math.prod(dims[1:])
        return self.matmul_rows(config), kc, wide, self.out_rows(config)

    def out_rows(self, config) -> int:
        return config["out_channels"]

    # --- template --------------------------------------------------------------------
    def template_source(self) -> str:
        family = (Path(__file__).parent / "templates" / self.template_file).read_text()
        return f"{family}\n\n# ---- {self.name} ({self.jaxbench_id}) ----\n{self.template_part.strip()}\n"

    def flat_input_length(self, config, bs: int) -> int:
        """Length of a sample's flat input in the template's "vmem" mode: the padded columns
        plus the largest tap offset, rounded up to 128."""
        _, _, s, _ = self.matmul_shape(config)
        dims, k = self.window(config)
        strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
        return round_up(s, bs) + round_up((k - 1) * sum(strides), 128)

    def contraction(self, config, schedule) -> int:
        """The kernel's contraction at a schedule: taps x input channels, zero-padded to a
        multiple of ``pad_cin``."""
        _, kc, _, _ = self.matmul_shape(config)
        dims, k = self.window(config)
        taps = k ** len(dims)
        return taps * round_up(kc // taps, schedule.get("pad_cin", 1))

    def vmem_bytes(self, config, schedule) -> int:
        dt = config["dtype"]
        rows, kc, s, out_rows = self.matmul_shape(config)
        bs = s if self.whole_s else schedule["block_s"]
        out = tile_bytes((out_rows, 1), "float32") if self.reduce_s else tile_bytes((out_rows, bs), dt)
        common = 2 * out + (1 + EPILOGUE_TEMPS) * tile_bytes((rows, bs), "float32")
        dims, k = self.window(config)
        taps = k ** len(dims)
        kc = self.contraction(config, schedule)
        cin = kc // taps
        if schedule["patches"] in ("vmem", "vmem_im2col"):
            length = self.flat_input_length(config, bs)
            # The patch tile; taps_dot stacks bf16 slices that are not whole packed tiles in f32.
            split_tiles = jnp.dtype(dt).itemsize == 2 and cin % 16
            stacked = 0 if schedule["patches"] != "vmem_im2col" else \
                tile_bytes((kc, bs), dt) + (tile_bytes((kc, bs), "float32") if split_tiles else 0)
            if schedule.get("flatten") == "kernel":  # the (C, H, W) input blocks, and the f32 flat rows
                flat = tile_bytes((cin, length), "float32")
                return (schedule["buffers"] * tile_bytes((cin, config["height"], config["width"]), dt) + flat
                        + taps * tile_bytes((rows, cin), dt) + stacked + common)
            return (schedule["buffers"] * tile_bytes((cin, length), dt) + taps * tile_bytes((rows, cin), dt)
                    + 2 * tile_bytes((cin, length - round_up(s, bs) + bs), dt) + stacked + common)
        bk = min(schedule["block_k"], kc)
        return schedule["buffers"] * (tile_bytes((rows, bk), dt) + tile_bytes((bk, bs), dt)) + common

    def hwnc_samples(self, config, schedule) -> int:
        """Samples per iteration of ``conv2d_hwnc``'s loop (``min(block_n, N)`` in the template)."""
        return min(schedule["block_n"], config["batch_size"])

    def hwnc_vmem_bytes(self, config, schedule) -> int:
        """Estimated scoped VMEM of ``conv2d_hwnc``: double-buffered input rows, halo rows,
        weights and output rows of every sample, and one output row's stacked slab and f32
        temporaries for block_n samples."""
        dt, k = config["dtype"], config["kernel_size"]
        n, cin, cout, w = config["batch_size"], config["in_channels"], config["out_channels"], config["width"]
        nb, bh, wo = self.hwnc_samples(config, schedule), schedule["block_h"], w - k + 1
        pack = schedule["pack_w"]
        depth = -(-(pack + k - 1) // pack) * pack * cin  # the window's input columns x channels
        return 2 * (tile_bytes(((bh + k - 1) * w // pack * n, pack * cin), dt)
                    + tile_bytes((k * depth, pack * cout), dt) + tile_bytes((bh * wo * n, cout), dt)) \
            + tile_bytes((wo // pack * nb, depth), dt) \
            + (1 + EPILOGUE_TEMPS) * tile_bytes((wo // pack * nb, pack * cout), "float32")

    def hwnc_check(self, config, s) -> str | None:
        k, n = config["kernel_size"], config["batch_size"]
        ho, nb = self.out_spatial(config)[0], self.hwnc_samples(config, s)
        rows = tile_rows(config["dtype"])  # whole tiles: the window reshape stays free
        if k < 2 or ho % s["block_h"] or s["block_h"] % (k - 1):
            return (f"layout=hwnc: block_h={s['block_h']} must divide the {ho} output rows and be a multiple of "
                    f"kernel_size-1={k - 1} (the halo block)")
        if n % nb or (nb != n and nb % rows):
            return f"layout=hwnc: block_n={nb} must divide batch_size={n} and be a multiple of {rows} (or all of it)"
        pack, w = s["pack_w"], config["width"]
        if w % pack or (w - k + 1) % pack:
            return f"layout=hwnc: pack_w={pack} must divide the input's {w} and the output's {w - k + 1} columns"
        return over_vmem(self.hwnc_vmem_bytes(config, s), VMEM_LIMIT)

    def _schedule_space(self, config):
        _, kc, _, _ = self.matmul_shape(config)

        def check(s):
            if s.get("layout", "flat") != "flat":
                return self.layout_check(config, s)
            depth = self.contraction(config, s)
            if s["patches"] == "hbm" and s["block_k"] < depth and round_up(depth, 128) % s["block_k"]:
                return (f"block_k={s['block_k']} does not divide the contraction {depth} padded to "
                        f"{round_up(depth, 128)}")
            if s.get("flatten") == "kernel" and (s["patches"] != "vmem_im2col" or config["width"] % 128
                                                  or config["height"] % 16):
                return (f"flatten=kernel needs patches=vmem_im2col, width a multiple of 128 and height of 16 "
                        f"(here {config['height']} x {config['width']})")
            if s.get("accumulator") == "none" and s["patches"] == "hbm" and s["block_k"] < depth:
                return (f"accumulator=none needs the contraction in one step: patches from VMEM, or block_k >= "
                        f"{depth}, not {s['block_k']}")
            return over_vmem(self.vmem_bytes(config, s), VMEM_LIMIT)

        knobs = []
        if not self.whole_s:
            knobs.append(Knob("block_s", BLOCKS_S, self.default_block_s,
                              "output positions (matmul columns) per grid step; S is padded to a multiple"))
        if config["in_channels"] % 8:
            knobs.append(Knob("pad_cin", (1, 8), 1, "input channels zero-padded (the weights' too) to a multiple of "
                              "this: each tap's slice whole f32 sublane tiles, a deeper contraction"))
        knobs += [
            Knob("block_k", BLOCKS_K, self.default_block_k,
                 f"patch rows per grid step (contraction {kc}: >= that, all of it; below, it is padded to a "
                 "multiple of 128)"),
            Knob("buffers", (1, 2), 2, "pipeline buffers for the weight and patch blocks (jax 0.10.2 lowers only 1 or 2)"),
            Knob("patches", ("hbm", "vmem", "vmem_im2col"), self.default_patches,
                 "im2col by XLA into HBM (streamed in K blocks); or in the kernel from each sample's flat "
                 "input held in VMEM (block_k unused), one dot per tap, or the taps stacked into one patch "
                 "tile and one deeper dot"),
            Knob(ACCUMULATOR.name, ACCUMULATOR.values, ACCUMULATOR.default,
                 "'vmem': the dot summed into an f32 VMEM scratch the epilogue reads back; 'none': one K step "
                 "(patches from VMEM, or block_k >= the contraction), the dot's value straight to the epilogue"),
        ]
        if self.hwnc:
            knobs += [
                Knob("layout", ("flat", "hwnc"), "flat",
                     "flat: the im2col kernel above, output relaid out by XLA; hwnc: output rows written in the "
                     "device layout of the NCHW result (block_s, block_k, buffers, patches unused)"),
                # Larger blocks unroll past what Mosaic compiles in minutes (6 rows x 64 samples did not in 300 s).
                Knob("block_h", (2, 6), 2, "layout=hwnc: output rows (of every sample) per grid step"),
                Knob("block_n", (16, 32), 32, "layout=hwnc: samples per iteration of the step's loop"),
                Knob("pack_w", (1, 2), 1, "layout=hwnc: adjacent columns per matmul row (their channels side "
                     "by side in the lanes: 64 channels fill 128 at 2; a deeper, wider dot)"),
            ]
        return ScheduleSpace(knobs + self.own_knobs(config), check, conv_inert)

    def own_knobs(self, config) -> list[Knob]:
        """The workload's own knobs (variants of its epilogue or kernel), after the family's."""
        return []

    def layout_check(self, config, s) -> str | None:
        """Why schedule ``s`` with a non-flat ``layout`` cannot run (None if it can)."""
        return self.hwnc_check(config, s)


# The knobs only a non-flat layout's kernel reads (conv2d_hwnc's; 28k's ncdhw kernel's).
LAYOUT_KNOBS = {"hwnc": {"block_h", "block_n", "pack_w"}, "ncdhw": {"block_co"}}


def conv_inert(s) -> set:
    """The knobs a conv schedule leaves unused (``ScheduleSpace.inert``): with a non-flat layout
    the flat kernel's and the other layouts' ones, with the flat kernel every layout's ones, and
    block_k when the patches come from VMEM (no K blocks)."""
    layout = s.get("layout", "flat")
    others = set().union(*(knobs for name, knobs in LAYOUT_KNOBS.items() if name != layout)) & s.keys()
    if layout != "flat":
        return {"block_s", "block_k", "buffers", "patches", "accumulator"} | others
    return others | ({"block_k"} if s["patches"] != "hbm" else set())

