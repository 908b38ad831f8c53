"""Compiling for a TPU v6e (or v5e) without one: libtpu's ahead-of-time compiler on the CPU.

``prepare_process`` must run before jax is imported in a process that compiles for v6e
(the evaluation workers do it first thing).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence


def prepare_process(backend: str = "sim") -> None:
    """Environment variables for AOT v6e compilation next to a CPU jax runtime."""
    if backend != "tpu":
        os.environ["JAX_PLATFORMS"] = "cpu"  # run on the CPU even if libtpu could find a chip
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server off Cloud
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several workers load libtpu at once
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TPU_STDERR_LOG_LEVEL", "3")
    os.environ.setdefault("TPU_MIN_LOG_LEVEL", "3")
    if backend != "tpu":
        from jaxbench_env.sim import bundles

        bundles.enable()  # libtpu reads its dump flags once, when it loads


_TOPOLOGY_DEVICES: dict = {}
# Compile targets by chip: libtpu's topology names (a 1x1 slice of each).
TOPOLOGIES = {"v6e": "v6e:1x1", "v5e": "v5e:1x1"}


def device(chip: str = "v6e"):
    """A device of ``chip`` ("v6e" or "v5e") from a 1x1 topology description: a compile
    target, not a runtime."""
    if chip not in TOPOLOGIES:
        raise ValueError(f"no compile target for chip {chip!r} (known: {', '.join(TOPOLOGIES)})")
    if chip not in _TOPOLOGY_DEVICES:
        from jax.experimental import topologies

        from jaxbench_env.sim import bundles

        bundles.enable()  # in case prepare_process did not run: too late if libtpu is loaded

        topo = topologies.get_topology_desc(
            platform="tpu", topology_name=TOPOLOGIES[chip], chip_config_name="default",
            chips_per_host_bounds=(1, 1, 1), num_slices=1,
        )
        _TOPOLOGY_DEVICES[chip] = topo.devices[0]
    return _TOPOLOGY_DEVICES[chip]


def v6e_device():
    """A v6e device from a 1x1 topology description: a compile target, not a runtime."""
    return device("v6e")


def tpu_present() -> bool:
    """True when this process's jax sees a real TPU chip."""
    try:
        import jax

        return any(d.platform == "tpu" for d in jax.devices())
    except RuntimeError:
        return False


def compile_for_v6e(fn: Callable, specs: Sequence):
    """Trace, lower and compile ``fn`` for v6e at the shapes of ``specs``.

    Returns (traced, compiled): the traced jaxpr (for the simulator) and the compiled
    executable (cost analysis, HLO). Mosaic and XLA errors propagate as raised.
    """
    return compile_for(fn, specs, "v6e")


def compile_for(fn: Callable, specs: Sequence, chip: str = "v6e"):
    """``compile_for_v6e`` for the compile target ``chip`` ("v6e" or "v5e")."""
    import jax

    dev = device(chip)
    sharding = jax.sharding.SingleDeviceSharding(dev)
    args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs]
    # Some Mosaic lowering rules consult the default device and reject the CPU.
    with jax.default_device(dev):
        traced = jax.jit(fn).trace(*args)
        compiled = traced.lower().compile()
    return traced, compiled
