"""Greedy coordinate descent over schedule knobs."""

from __future__ import annotations

from policies.base import Policy, local_moves, schedule_action, schedule_key


class GreedyPolicy(Policy):
    """Coordinate descent: one evaluation per step, on the main env.

    Each ``act`` proposes the next untried local move (``local_moves``) from the best schedule found so
    far (``env.unwrapped.best``), allowed by the action mask there, nearest knob values
    first (every knob's +-1 index, then +-2, ...). The env evaluates it as a normal step.
    If the move beats the best, the env records it as the new best and the next moves
    start from there; if not, the next move still starts from the old best, because each
    schedule action names the whole schedule (the env's *current* schedule may have moved
    to the worse-but-correct candidate; that does not matter for schedule actions).

    Stepping the main env (rather than trying moves on ``fork()``s) keeps every
    evaluation visible as a step: reward, history and logs count real work. When every
    move around the best has been tried (a local optimum), it re-proposes the best
    schedule, which the result cache answers instantly.
    """

    name = "greedy"

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tried: set = set()

    def _base(self, u) -> dict:
        if u.best is not None:
            return dict(u.best[1])
        return dict(u.schedule)

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "source":
            raise ValueError("GreedyPolicy needs action_mode 'schedule' or 'both'")
        base, space = self._base(u), u.schedule_space
        self.tried.add(schedule_key(base, space))
        for h in u.history:
            self.tried.add(schedule_key(h["schedule"], space))
        for cand in local_moves(space, base):
            key = schedule_key(cand, space)
            if key not in self.tried:
                self.tried.add(key)
                return schedule_action(env, cand)
        return schedule_action(env, base)
