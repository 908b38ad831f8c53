"""JAXBench-Gym: Gymnasium environments for optimizing Pallas TPU kernels.

Importing this package registers every workload as ``JAXBench/<name>-v0``.
"""

from __future__ import annotations

import gymnasium as gym

from workloads import WORKLOADS

ENV_ENTRY_POINT = "jaxbench_env.env:JAXBenchEnv"


def env_id(name: str) -> str:
    return f"JAXBench/{name}-v0"


def register_all() -> None:
    for name in WORKLOADS:
        if env_id(name) not in gym.registry:
            gym.register(id=env_id(name), entry_point=ENV_ENTRY_POINT, kwargs={"workload": name},
                         nondeterministic=True)


register_all()

__all__ = ["env_id", "register_all", "WORKLOADS"]
