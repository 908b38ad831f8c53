"""Gradient search over block sizes on the simulator's differentiable tier (DOSA-style).

At the first step the policy builds the relaxed model of the env's current source around
its current schedule (``jaxbench_env.sim.relaxed``: traces only, no compile), descends it
with Adam from the current schedule and from ``starts - 1`` random points in the knobs'
log2 ranges, rounds each end point to the legal schedules around it (the corners of its
grid cell that the space's check allows) and ranks those by the relaxed model, followed
by their one-step neighbours, also ranked. Each ``act`` then proposes the next one for the full
simulator to judge (one env step, one evaluation). Non-block knobs keep their current
values. When the proposals run out (or ``max_proposals`` have been made: greedy refinement
follows), or the model cannot be built (no block-size knob, no
pallas_call, or a current source that is not the workload's own template: building the
model traces it in the policy's process, where candidate code must never run), it falls
back to local moves (``local_moves``) around the best schedule seen.
"""

from __future__ import annotations

import itertools

import numpy as np

from policies.base import Policy, local_moves, schedule_action, schedule_key


class GradientPolicy(Policy):
    name = "gradient"

    def __init__(self, starts: int = 8, iterations: int = 150, lr: float = 0.15, seed: int | None = None,
                 max_proposals: int | None = None):
        self.starts, self.iterations, self.lr, self.seed = starts, iterations, lr, seed
        self.max_proposals = max_proposals
        self.reset()

    def reset(self) -> None:
        self._queue: list[dict] | None = None
        self._tried: set = set()
        self.model = None
        self.error: str | None = None

    def proposals(self, env) -> list[dict]:
        """Legal schedules near the descents' end points, best first by the relaxed model."""
        from jaxbench_env.sim import relaxed

        u = env.unwrapped
        space = u.schedule_space
        if u.source != u.workload.template_source():
            # Modelling means tracing in this process: only the project's own template may run here.
            self.error = "no relaxed model: the current source is not the workload's template"
            return []
        try:
            self.model = relaxed.build(u.workload, template_tracer(u.workload), u.schedule)
        except Exception as e:  # noqa: BLE001 - any failure: fall back to local moves
            self.error = f"no relaxed model: {e}"
            return []
        model = self.model
        rng = np.random.default_rng(self.seed)
        starts = [model.x0] + [rng.uniform(model.lower, model.upper) for _ in range(self.starts - 1)]
        rounded = [s for x in starts
                   for s in _roundings(model, relaxed.descend(model, x, self.iterations, self.lr), u.schedule, space)]
        # The roundings first, then their legal one-step neighbours, each group by the model.
        neighbours = [n for s in rounded for n in _steps(model, s, space)]
        ranked, seen = [], set()
        for group in (rounded, neighbours):
            for schedule in sorted(group, key=lambda s: float(model.time(np.log2([s[k] for k in model.knobs])))):
                if schedule_key(schedule, space) not in seen:
                    seen.add(schedule_key(schedule, space))
                    ranked.append(schedule)
        return ranked

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "source":
            raise ValueError("GradientPolicy needs action_mode 'schedule' or 'both'")
        space = u.schedule_space
        if self._queue is None:
            self._tried.add(schedule_key(u.schedule, space))
            self._queue = self.proposals(env)[:self.max_proposals]
        while self._queue:
            schedule = self._queue.pop(0)
            if schedule_key(schedule, space) not in self._tried:
                self._tried.add(schedule_key(schedule, space))
                return schedule_action(env, schedule)
        best = u.best[1] if u.best else u.schedule
        for schedule in local_moves(space, best):
            if schedule_key(schedule, space) not in self._tried:
                self._tried.add(schedule_key(schedule, space))
                return schedule_action(env, schedule)
        return schedule_action(env, best)


def template_tracer(workload):
    """``trace(schedule)``: the jaxpr of ``workload``'s own template at a schedule."""
    import jax

    from jaxbench_env.candidate_process import load_module

    specs = jax.eval_shape(lambda: workload.make_inputs(workload.config, 0))

    def trace(schedule):
        module = load_module(workload.template_source(), workload.config, dict(schedule))
        return jax.jit(module.workload).trace(*specs).jaxpr.jaxpr

    return trace


def _roundings(model, x, base: dict, space) -> list[dict]:
    """The legal schedules at the corners of the grid cell around ``x`` (each block knob
    rounded down or up); where none is legal (over VMEM, say), the corners with one knob a
    value smaller."""
    by_name = {k.name: k for k in space.knobs}
    choices = []
    for name, xi in zip(model.knobs, x):
        values = sorted(by_name[name].values)
        below = [v for v in values if np.log2(v) <= xi + 1e-6] or values[:1]
        above = [v for v in values if np.log2(v) >= xi - 1e-6] or values[-1:]
        choices.append(sorted({below[-1], above[0]}))
    corners = [{**base, **dict(zip(model.knobs, combo))} for combo in itertools.product(*choices)]
    legal = [c for c in corners if space.check(c) is None]
    if legal:
        return legal
    return [s for c in corners for s in _steps(model, c, space, up=False)]


def _steps(model, schedule: dict, space, up: bool = True) -> list[dict]:
    """Legal schedules one block knob a value away (down, and up unless ``up`` is False)."""
    by_name = {k.name: k for k in space.knobs}
    out = []
    for name in model.knobs:
        values = sorted(by_name[name].values)
        i = values.index(schedule[name])
        for j in ((i - 1, i + 1) if up else (i - 1,)):
            if 0 <= j < len(values) and space.check({**schedule, name: values[j]}) is None:
                out.append({**schedule, name: values[j]})
    return out
