"""The TPU v6e performance simulator (first tier: an analytic roofline per grid step)."""

from .hardware import V6E, Chip
from .model import SimBreakdown, predict_program

__all__ = ["V6E", "Chip", "SimBreakdown", "predict_program"]
