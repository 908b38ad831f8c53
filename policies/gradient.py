"""Gradient search over block sizes on the simulator's differentiable tier (DOSA-style).

At the first step the policy builds the relaxed model of the env's current source around
its current schedule (``jaxbench_env.sim.relaxed``: traces only, no compile), descends it
with Adam from the current schedule and from ``starts - 1`` random points in the knobs'
log2 ranges, rounds each end point to the nearest legal schedule and ranks those distinct
schedules by the relaxed model. Each ``act`` then proposes the next one for the full
simulator to judge (one env step, one evaluation). Non-block knobs keep their current
values. When the proposals run out, or the model cannot be built (no block-size knob, no
pallas_call), it falls back to one-knob moves around the best schedule seen.
"""

from __future__ import annotations

import numpy as np

from policies.base import Policy, one_knob_moves, schedule_action, schedule_key


class GradientPolicy(Policy):
    name = "gradient"

    def __init__(self, starts: int = 8, iterations: int = 150, lr: float = 0.15, seed: int | None = None):
        self.starts, self.iterations, self.lr, self.seed = starts, iterations, lr, seed
        self.reset()

    def reset(self) -> None:
        self._queue: list[dict] | None = None
        self._tried: set = set()
        self.model = None
        self.error: str | None = None

    def _plan(self, env) -> list[dict]:
        from jaxbench_env.sim import relaxed

        u = env.unwrapped
        space = u.schedule_space
        try:
            self.model = relaxed.build(u.workload, u.source, u.schedule)
        except Exception as e:  # noqa: BLE001 - any failure: fall back to local moves
            self.error = f"no relaxed model: {e}"
            return []
        rng = np.random.default_rng(self.seed)
        model = self.model
        starts = [model.x0] + [rng.uniform(model.lower, model.upper) for _ in range(self.starts - 1)]
        scored = {}
        for x in starts:
            end = relaxed.descend(model, x, self.iterations, self.lr)
            schedule = model.schedule(end, u.schedule, space)
            if space.check(schedule) is None:
                x_legal = np.log2([schedule[k] for k in model.knobs])
                scored[schedule_key(schedule)] = (float(model.time(x_legal)), schedule)
        return [s for _, s in sorted(scored.values(), key=lambda t: t[0])]

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "source":
            raise ValueError("GradientPolicy needs action_mode 'schedule' or 'both'")
        if self._queue is None:
            self._tried.add(schedule_key(u.schedule))
            self._queue = self._plan(env)
        while self._queue:
            schedule = self._queue.pop(0)
            if schedule_key(schedule) not in self._tried:
                self._tried.add(schedule_key(schedule))
                return schedule_action(env, schedule)
        best = u.best[1] if u.best else u.schedule
        for schedule in one_knob_moves(u.schedule_space, best):
            if schedule_key(schedule) not in self._tried:
                self._tried.add(schedule_key(schedule))
                return schedule_action(env, schedule)
        return schedule_action(env, best)
