"""Random search: uniformly random schedules the action mask allows."""

from __future__ import annotations

from policies.base import Policy


class RandomPolicy(Policy):
    """Samples a schedule action from ``env.action_space`` under ``env.unwrapped.action_masks()``.

    The mask allows, per knob, the values that pass the schedule check with the other
    knobs as they are now, so a sample can still combine two individually allowed values
    into a rejected schedule; the env then answers with the penalty. ``legal_only`` samples
    again (up to ``tries`` times) until the whole schedule passes the check, which costs no
    evaluation: a stronger baseline on tightly coupled spaces. In "both" mode the source part
    is empty (keep the current source). ``seed`` seeds a private copy of the space's sampler;
    without it the env's own (reset-seeded) action space samples.
    """

    name = "random"

    def __init__(self, seed: int | None = None, legal_only: bool = False, tries: int = 256):
        self.seed, self.legal_only, self.tries = seed, legal_only, tries
        self._space = None

    def reset(self) -> None:
        self._space = None

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "source":
            raise ValueError("RandomPolicy needs action_mode 'schedule' or 'both'")
        if self.seed is not None:
            if self._space is None:
                self._space = u.schedule_space.gym_space(seed=self.seed)
            space = self._space
        else:
            space = env.action_space if u.action_mode == "schedule" else env.action_space["schedule"]
        mask = u.action_masks()
        sched = space.sample(mask=mask)
        for _ in range(self.tries if self.legal_only else 0):
            if u.schedule_space.check(u.schedule_space.decode(sched)) is None:
                break
            sched = space.sample(mask=mask)
        return {"schedule": sched, "source": ""} if u.action_mode == "both" else sched
