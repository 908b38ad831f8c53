"""The TPU v6e performance simulator: compiled-program features, priced with fitted constants."""

from .hardware import V5E, V6E, Calibration, Chip, calibration
from .model import ProgramFeatures, SimBreakdown, predict_program, price, program_features

__all__ = ["V5E", "V6E", "Calibration", "Chip", "calibration", "ProgramFeatures", "SimBreakdown",
           "predict_program", "price", "program_features"]
