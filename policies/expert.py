"""The expert policy: propose the workload's hand-tuned kernel, the suite's upper bound.

JAXBench pairs eight workloads with Pallas TPU kernels that ship inside jax
(``jax.experimental.pallas.ops.tpu``) and block sizes grid-searched on a v6e. Each lives
in ``workloads/experts/<name>.py`` as an ordinary candidate module, so the expert is
judged exactly like any other source action: compiled for v6e, checked, timed.
"""

from __future__ import annotations

import workloads
from policies.base import Policy


class ExpertPolicy(Policy):
    """Acts in "source" (or "both") mode with the expert module's full text, every step.

    The first step evaluates it; later steps repeat the same candidate, which the result
    cache answers at once. Raises ValueError on a workload without an expert.
    """

    name = "expert"

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "schedule":
            raise ValueError("ExpertPolicy needs action_mode 'source' or 'both'")
        source = u.workload.expert_source()
        if source is None:
            raise ValueError(f"{u.workload.name} has no expert kernel; "
                             f"experts exist for: {', '.join(sorted(workloads.with_expert()))}")
        if u.action_mode == "both":
            return {"schedule": u.schedule_space.encode(u.schedule), "source": source}
        return source
