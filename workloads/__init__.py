"""The JAXBench workloads, by snake name (workloads.md section 1)."""

from __future__ import annotations

from typing import Any, Mapping

from .base import Workload
from .conv_workloads import CONV_WORKLOADS
from .cross_entropy import CrossEntropy
from .flash_attention import FlashAttention
from .flex_attention import FlexAttention
from .gemm import Gemm
from .gqa_attention import GQAAttention
from .mamba2_ssd import Mamba2SSD
from .matmul_workloads import MATMUL_WORKLOADS
from .megablox_gmm import MegabloxGMM
from .mixtral_moe import MixtralMoE
from .mla_attention import MLAAttention
from .paged_attention import PagedAttention
from .ragged_dot import RaggedDot
from .ragged_paged_attention import RaggedPagedAttention
from .retnet_retention import RetNetRetention
from .rmsnorm import RMSNorm
from .sparse_attention import SparseAttention
from .swiglu_mlp import SwiGLUMLP
from .triangle_multiplication import TriangleMultiplication

PRODUCTION = (  # JAXBench's order, 1p-17p
    FlashAttention, GQAAttention, MLAAttention, SparseAttention, FlexAttention, PagedAttention,
    RaggedPagedAttention, Gemm, SwiGLUMLP, MixtralMoE, MegabloxGMM, RMSNorm, CrossEntropy,
    RaggedDot, RetNetRetention, Mamba2SSD, TriangleMultiplication,
)
KERNELBENCH = tuple(sorted(CONV_WORKLOADS + MATMUL_WORKLOADS, key=lambda cls: int(cls.jaxbench_id[:-1])))  # 18k-50k
WORKLOADS: dict[str, type[Workload]] = {cls.name: cls for cls in PRODUCTION + KERNELBENCH}


def get(name: str, config: Mapping[str, Any] | None = None) -> Workload:
    """The workload ``name`` bound to ``config`` (overrides of its full-size dimensions)."""
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}") from None
    return cls(config)


def with_expert() -> list[str]:
    """Names of the workloads that ship an expert kernel."""
    return [name for name, cls in WORKLOADS.items() if cls.expert_file]
