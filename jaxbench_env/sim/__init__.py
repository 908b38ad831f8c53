"""The TPU v6e performance simulator: compiled-program features, priced with fitted constants."""

from .hardware import V5E, V6E, Calibration, Chip, calibration
from .model import FEATURES_VERSION, ProgramFeatures, SimBreakdown, predict_program, price, program_features

__all__ = ["FEATURES_VERSION", "V5E", "V6E", "Calibration", "Chip", "calibration", "ProgramFeatures", "SimBreakdown",
           "predict_program", "price", "program_features"]
