"""Chip descriptions for the simulator, every constant with where it comes from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    name: str
    mxu_flops_per_s: float  # dense bf16 matmul peak
    hbm_bytes_per_s: float
    vector_elems_per_s: float  # elementwise VPU throughput
    transcendentals_per_s: float  # EUP throughput
    step_overhead_s: float  # fixed cost of one Pallas grid step
    scoped_vmem_bytes: int
    vmem_bytes: int


# Peak MXU rate, HBM bandwidth and VMEM size: jax's chip table
# (jax.experimental.pallas.tpu.get_tpu_info_for_chip(ChipVersion.TPU_V6E, 1)).
# Vector and EUP rates: assumed 4 VALUs x one 8x128 vreg per cycle and one EUP vreg per
# cycle at an assumed 1.5 GHz; step overhead 0.35 us from the per-step DMA latency seen
# on v5e in the Pallas matmul tutorial (DESIGN.md). These are uncalibrated first guesses:
# the calibrated simulator replaces them with fitted values.
V6E = Chip(
    name="TPU v6e",
    mxu_flops_per_s=9.2e14,
    hbm_bytes_per_s=1.64e12,
    vector_elems_per_s=4 * 1024 * 1.5e9,
    transcendentals_per_s=1024 * 1.5e9,
    step_overhead_s=0.35e-6,
    scoped_vmem_bytes=32 * 2**20,
    vmem_bytes=128 * 2**20,
)
