"""What the KernelBench tier (18k-50k) shares: dtype, seeded inputs, config validation.

workloads.md section 3, "KernelBench tier": the activation input is U[0,1) in dtype D keyed
by key(0); weights and biases are N(0,1)*0.02 from ``split(key(0xBADC0DE), n)`` (the cdb2234
set) or ``split(key(42), n)`` (the 8fa8f3b set). D is bf16 as the JAXBench harness runs the
suite; ``config={"dtype": "float32"}`` gives KernelBench's own setting.

Seeds: seed 0 gives the spec's inputs; seed s offsets every base key by s. The check's
seeds (never 0) draw structured inputs (``base.structured_normal``) from the same keys, so
that a kernel cannot pass on the i.i.d. draw's statistics, in this tier's shared code:

* activations (``uniform``): U[0,1)'s mean 0.5 and sd 0.29, with per-row and per-column
  means and scales, a low-rank part and outliers; the rows are the matmul's tokens, or a
  convolution's (sample, channel) images with the positions as columns (``row_axes=2``);
* weights (``normal`` with ``base.WEIGHT_STRUCTURE``): the spec's scale, with scales, a
  low-rank part and outliers but no means (a mean constant along the fan-in would be summed
  against activations of mean 0.5);
* biases (``bias``): ``BIAS_SCALE`` instead of the spec's 0.02, which is invisible next to
  activations of spread ~1, so a kernel that drops a bias passes on the spec's draw;
* the spec's constant parameters (``constant``): running means and variances, norm
  weights and biases are 0 or 1 in the spec, so a kernel that skips them (a norm assuming a
  zero mean and unit variance) passes; here the ones are log-normal around 1 (log-sd
  ``ONES_LOG_SD``: positive, variances kept away from zero) and the zeros are structured
  with RMS ``ZEROS_SCALE``.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from .base import WEIGHT_STRUCTURE, Workload, require_positive_ints, seeded_normal, structured_normal

K0, K42, KB = 0, 42, 0xBADC0DE
DTYPES = ("bfloat16", "float32")
BIAS_SCALE = 0.25
ONES_LOG_SD = 0.15
ZEROS_SCALE = 0.25


def keys(base: int, n: int, seed: int) -> list:
    """``split(key(base + seed), n)`` as a list, consumed in the spec's input order."""
    return list(jax.random.split(jax.random.key(base + seed), n))


def side_key(base: int, seed: int, name: str):
    """The key of a parameter the spec draws no key for (a constant), at seeds other than 0."""
    return jax.random.fold_in(jax.random.key(base + seed), zlib.crc32(name.encode()) % 2**31)


def uniform(key, shape, dt, seed: int = 0, **structure):
    """U[0,1) (seed 0), or structured with its mean and sd."""
    if seed == 0:
        return jax.random.uniform(key, shape, dt)
    return structured_normal(key, shape, dt, scale=math.sqrt(1 / 12), offset=0.5, **structure)


def normal(key, shape, dt, scale: float = 0.02, seed: int = 0, **structure):
    """N(0,1) generated in ``dt``, times ``scale`` afterwards (the spec's ``N*c``), or a
    structured weight of that scale."""
    return seeded_normal(key, shape, dt, seed, scale=scale, **{**WEIGHT_STRUCTURE, **structure})


def bias(key, shape, dt, seed: int = 0, scale: float = 0.02, check_scale: float = BIAS_SCALE, **structure):
    """A bias: the spec's N*scale at seed 0, structured with RMS max(scale, check_scale) otherwise."""
    return seeded_normal(key, shape, dt, seed, scale=scale if seed == 0 else max(scale, check_scale), **structure)


def constant(init: str, shape, dt, seed: int = 0, key=None):
    """The spec's ones or zeros at seed 0; otherwise log-normal around 1 or structured around 0."""
    if seed == 0:
        return (jnp.ones if init == "ones" else jnp.zeros)(shape, dt)
    if init == "ones":
        return jnp.exp(structured_normal(key, shape, jnp.float32, scale=ONES_LOG_SD, outliers=0.0)).astype(dt)
    return structured_normal(key, shape, dt, scale=ZEROS_SCALE)


def fan_in_scale(config: Mapping[str, Any], defaults: Mapping[str, Any], key: str) -> float:
    """sqrt(full / actual) for contraction dimension ``key``: 1 at the spec's size.

    Weights drawn N*0.02 give activations whose spread grows with the contraction length.
    Scaling them by this factor keeps a shrunk (check-size) or overridden problem's values
    at the full-size scale, so the check's tolerance means the same thing at every size.
    """
    return math.sqrt(defaults[key] / config[key])


class KernelBenchWorkload(Workload):
    """Base of the 33 KernelBench workloads: ``dims`` are the config keys that must be
    positive ints; ``dtype`` must be bfloat16 or float32."""

    dims: tuple[str, ...] = ()

    def validate_config(self, config):
        require_positive_ints(self.name, config, self.dims)
        if config["dtype"] not in DTYPES:
            raise ValueError(f"{self.name}: dtype must be one of {DTYPES}, got {config['dtype']!r}")
        self.validate_shapes(config)

    def validate_shapes(self, config: Mapping[str, Any]) -> None:
        """Raise ValueError for dimensions this workload's math or template cannot take."""

    def dt(self, config: Mapping[str, Any]):
        return jnp.dtype(config["dtype"])
