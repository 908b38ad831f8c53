"""Schedule spaces: a template's tunable knobs and their legal values.

A schedule is a plain dict ``{knob name: value}``. The space maps it to and from a
``MultiDiscrete`` index vector, which is what RL agents act with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from gymnasium import spaces


@dataclass(frozen=True)
class Knob:
    """One schedule parameter: a name, its legal values and the template's default."""

    name: str
    values: tuple
    default: Any
    doc: str = ""

    def __post_init__(self):
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} not in {self.values}")


class ScheduleSpace:
    """An ordered set of knobs, with a validity rule over whole schedules.

    ``check(schedule)`` returns None for a schedule worth evaluating, or a readable
    reason why it cannot work (a block that does not divide the shape, a VMEM budget
    exceeded). It only rules out what is certain; the real compiler has the last word.
    ``inert(schedule)`` names the knobs that schedule leaves unused (block_k with all of K
    in one step): changing them builds the same program, so a search need not try it.
    """

    def __init__(self, knobs: Sequence[Knob], check: Callable[[Mapping[str, Any]], str | None] | None = None,
                 inert: Callable[[Mapping[str, Any]], Iterable[str]] | None = None):
        self.knobs = tuple(knobs)
        self._check = check
        self._inert = inert
        self.nvec = np.array([len(k.values) for k in self.knobs], dtype=np.int64)

    def inert(self, schedule: Mapping[str, Any]) -> frozenset:
        """The knobs ``schedule`` leaves unused."""
        return frozenset(self._inert(schedule)) if self._inert else frozenset()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def default(self) -> dict:
        return {k.name: k.default for k in self.knobs}

    def gym_space(self, seed: int | None = None) -> spaces.MultiDiscrete:
        # A template without knobs still gets a one-choice space, so the Dict stays valid.
        return spaces.MultiDiscrete(self.nvec if len(self.knobs) else np.array([1]), seed=seed)

    def decode(self, indices) -> dict:
        """Index vector -> schedule dict. Raises ValueError for an index out of range."""
        idx = np.asarray(indices).reshape(-1)
        if not len(self.knobs):
            return {}
        if idx.shape != (len(self.knobs),):
            raise ValueError(f"schedule action needs {len(self.knobs)} indices, got shape {np.shape(indices)}")
        out = {}
        for knob, i in zip(self.knobs, idx):
            if not 0 <= int(i) < len(knob.values):
                raise ValueError(f"knob {knob.name}: index {int(i)} outside 0..{len(knob.values) - 1}")
            out[knob.name] = knob.values[int(i)]
        return out

    def encode(self, schedule: Mapping[str, Any]) -> np.ndarray:
        """Schedule dict -> index vector; a value outside a knob's list encodes as its default."""
        if not len(self.knobs):
            return np.zeros(1, dtype=np.int64)
        return np.array([k.values.index(v) if (v := schedule.get(k.name, k.default)) in k.values
                         else k.values.index(k.default) for k in self.knobs], dtype=np.int64)

    def check(self, schedule: Mapping[str, Any]) -> str | None:
        for knob in self.knobs:
            if schedule.get(knob.name, knob.default) not in knob.values:
                return f"knob {knob.name}: {schedule.get(knob.name)!r} is not one of {knob.values}"
        return self._check(schedule) if self._check else None

    def mask(self, current: Mapping[str, Any]) -> np.ndarray:
        """Flat 0/1 mask over every knob's values (concatenated in knob order).

        Value v of knob i is allowed when the schedule with knob i set to v and every
        other knob as in ``current`` passes ``check``: the moves one knob away from here.
        """
        parts = []
        for knob in self.knobs:
            parts.append([self.check({**current, knob.name: v}) is None for v in knob.values])
        if not parts:
            return np.ones(1, dtype=np.int8)
        return np.concatenate([np.array(p, dtype=np.int8) for p in parts])

    def split_mask(self, flat_mask: np.ndarray) -> tuple[np.ndarray, ...]:
        """Flat mask -> the per-knob tuple that ``MultiDiscrete.sample(mask=...)`` takes."""
        bounds = np.cumsum(self.nvec)[:-1]
        return tuple(np.asarray(m, dtype=np.int8) for m in np.split(flat_mask, bounds))

    def nearest_valid(self, schedule: Mapping[str, Any]) -> dict:
        """``schedule`` if it passes ``check``, else the valid schedule fewest index steps away
        (for configs too small for the template's default blocks)."""
        if self.check(schedule) is None:
            return dict(schedule)
        here = self.encode(schedule)
        best = min((s for s in self.all_schedules() if self.check(s) is None),
                   key=lambda s: int(np.abs(self.encode(s) - here).sum()), default=None)
        if best is None:
            raise ValueError(f"no schedule in the space is valid here: {self.check(schedule)}")
        return best

    def all_schedules(self):
        """Every schedule in the space (the product of the knobs' values)."""
        import itertools

        for combo in itertools.product(*(k.values for k in self.knobs)):
            yield dict(zip(self.names, combo))
