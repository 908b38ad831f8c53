"""Chip descriptions and the simulator's fitted constants, each with where it comes from.

``Chip`` holds what jax's chip table states
(``jax.experimental.pallas.tpu.get_tpu_info_for_chip(ChipVersion.TPU_V6E, 1)``, jax 0.10.2;
the numbers are copied here so that pricing needs no jax import, and a test checks them
against the table). ``Calibration`` holds the few global constants nobody publishes,
fitted on published v6e times by ``python -m jaxbench_env.calibrate fit`` and stored, versioned,
in ``jaxbench_env/data/sim_calibration.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

CALIBRATION_FILE = Path(__file__).parent.parent / "data" / "sim_calibration.json"


@dataclass(frozen=True)
class Chip:
    name: str
    chip_version: str  # jax's ChipVersion name
    mxu_flops_per_s: float  # dense bf16 peak (chip table: bf16_ops_per_second)
    hbm_bytes_per_s: float  # chip table: mem_bw_bytes_per_second
    vmem_bytes: int  # chip table: vmem_capacity_bytes
    mxus: int  # chip table: num_mxus
    mxu_size: int  # chip table: mxu_column_size
    scoped_vmem_bytes: int  # Mosaic's default scoped VMEM limit (v6e: 32 MiB; v5e: 16 MiB)

    def floor_s(self, hbm_bytes: float, flops: float) -> float:
        """The physical floor: no program moving ``hbm_bytes`` and computing ``flops`` runs
        faster than either at this chip's peak rate."""
        return max(hbm_bytes / self.hbm_bytes_per_s, flops / self.mxu_flops_per_s)


V6E = Chip("TPU v6e", "TPU_V6E", mxu_flops_per_s=9.2e14, hbm_bytes_per_s=1.64e12, vmem_bytes=128 * 2**20,
           mxus=2, mxu_size=256, scoped_vmem_bytes=32 * 2**20)
V5E = Chip("TPU v5e", "TPU_V5E", mxu_flops_per_s=1.97e14, hbm_bytes_per_s=8.2e11, vmem_bytes=128 * 2**20,
           mxus=4, mxu_size=128, scoped_vmem_bytes=16 * 2**20)


@dataclass(frozen=True)
class Calibration:
    """Global constants of the pricing model (never one per workload).

    bundle_rate_hz: bundles issued per second (one per cycle: the effective clock).
    hbm_efficiency: fraction of the chip's peak HBM bandwidth that streaming achieves.
    generated_kernel_efficiency: the same fraction for the Mosaic kernels the compiler
        writes itself (the online softmax of XLA attention, which reads a materialized
        score matrix): these run slower than their bundles and bytes say, and one shared
        bandwidth would otherwise be pulled down for every op to fit them.
    overlap: how compute and HBM traffic of one op combine, ``(c**p + m**p)**(1/p)``;
        1 adds them, large values take the larger (perfect overlap).
    op_overhead_s: fixed cost of launching one XLA op or kernel (not fitted: 0).
    step_overhead_s: the DMA issue-to-completion latency of one Pallas grid step: the
        shortest a double-buffered step can be, whatever its bundles (not fitted: 0.35 us,
        the time per step of the Pallas matmul guide's 128^3 blocks on v5e).
    vector_ops_per_s, transcendentals_per_s: element rates of the analytic fallback for
        kernels whose bundles cannot be read (not fitted: 4 VALUs x one 8x128 vreg per
        cycle, one EUP vreg per cycle, at the fitted clock).
    """

    version: str
    fitted_on: str
    bundle_rate_hz: float
    hbm_efficiency: float
    generated_kernel_efficiency: float
    overlap: float
    op_overhead_s: float
    step_overhead_s: float

    @property
    def vector_ops_per_s(self) -> float:
        return 4 * 1024 * self.bundle_rate_hz

    @property
    def transcendentals_per_s(self) -> float:
        return 1024 * self.bundle_rate_hz

    @classmethod
    def load(cls, path: Path = CALIBRATION_FILE) -> "Calibration":
        data = json.loads(Path(path).read_text())
        return cls(version=data["version"], fitted_on=data["fitted_on"], **data["constants"])

    def constants(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("version", "fitted_on")}


# Before any fit: the clock implied by the gemm expert's bundles and published time (DESIGN
# notes), peak bandwidth, perfect overlap, the per-step latency seen on v5e.
UNFITTED = Calibration(version="unfitted", fitted_on="-", bundle_rate_hz=1.59e9, hbm_efficiency=1.0,
                       generated_kernel_efficiency=1.0, overlap=16.0, op_overhead_s=0.0, step_overhead_s=0.35e-6)


def calibration() -> Calibration:
    """The fitted constants, or the unfitted guesses when no fit has been stored."""
    return Calibration.load() if CALIBRATION_FILE.exists() else UNFITTED
