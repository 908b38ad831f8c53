"""What the KernelBench tier (18k-50k) shares: dtype, seeded inputs, config validation.

workloads.md section 3, "KernelBench tier": the activation input is U[0,1) in dtype D keyed
by key(0); weights and biases are N(0,1)*0.02 from ``split(key(0xBADC0DE), n)`` (the cdb2234
set) or ``split(key(42), n)`` (the 8fa8f3b set). D is bf16 as the JAXBench harness runs the
suite; ``config={"dtype": "float32"}`` gives KernelBench's own setting.

Seeds: seed 0 gives the spec's inputs; seed s offsets every base key by s.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from .base import Workload, require_positive_ints

K0, K42, KB = 0, 42, 0xBADC0DE
DTYPES = ("bfloat16", "float32")


def keys(base: int, n: int, seed: int) -> list:
    """``split(key(base + seed), n)`` as a list, consumed in the spec's input order."""
    return list(jax.random.split(jax.random.key(base + seed), n))


def uniform(key, shape, dt):
    return jax.random.uniform(key, shape, dt)


def normal(key, shape, dt, scale: float = 0.02):
    """N(0,1) generated in ``dt``, times ``scale`` afterwards (the spec's ``N*c``)."""
    x = jax.random.normal(key, shape, dt)
    return x if scale == 1.0 else x * scale


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
    # In bf16 the references' own rounding reaches the spec's 1e-2 (workloads.md section 7).
    float32_check = True

    def validate_config(self, config):
        require_positive_ints(self.name, config, self.dims)
        if config["dtype"] not in DTYPES:
            raise ValueError(f"{self.name}: dtype must be one of {DTYPES}, got {config['dtype']!r}")
        self.validate_shapes(config)

    def validate_shapes(self, config: Mapping[str, Any]) -> None:
        """Raise ValueError for dimensions this workload's math or template cannot take."""

    def dt(self, config: Mapping[str, Any]):
        return jnp.dtype(config["dtype"])
