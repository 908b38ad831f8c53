"""Beam search over schedules, Autocomp-style: a child is kept only if it beats its parent."""

from __future__ import annotations

from typing import Callable

from policies.base import Policy, one_knob_moves, schedule_action, schedule_key


def beam_search(env, beam_width: int = 4, depth: int = 2, expand: int | None = None,
                callback: Callable[[dict, float | None], None] | None = None) -> tuple[dict, float]:
    """Search one-knob moves level by level on ``fork()``s of ``env``; the env itself is untouched.

    The root is the env's current schedule (the env is reset first if it has not been).
    Each level expands every beam node into up to ``expand`` one-knob moves (nearest values
    first; all of them if None) that the schedule check allows and no node has tried yet,
    evaluates each on a fork of its parent, keeps the children that beat their parent's
    speedup, and carries the best ``beam_width`` of them to the next level. Stops after
    ``depth`` levels or when no child improves. ``callback(schedule, speedup)`` sees every
    evaluation. Returns the best (schedule, speedup) seen, the root included.
    """
    root = env.unwrapped
    if root.last is None:
        env.reset()
    start = root.fork()
    best = (dict(start.schedule), float(start.current_speedup))
    beam = [(start, best[1])]
    seen = {schedule_key(start.schedule)}
    for _ in range(depth):
        children = []
        for node, parent_speedup in beam:
            moves = [m for m in one_knob_moves(node.schedule_space, node.schedule) if schedule_key(m) not in seen]
            for move in moves[:expand] if expand is not None else moves:
                seen.add(schedule_key(move))
                child = node.fork()
                _, _, _, _, info = child.step(schedule_action(child, move))
                speedup = info["speedup"]
                if callback is not None:
                    callback(dict(move), speedup)
                if speedup is not None and speedup > parent_speedup:
                    children.append((child, speedup))
                    if speedup > best[1]:
                        best = (dict(move), float(speedup))
        if not children:
            break
        beam = sorted(children, key=lambda c: -c[1])[:beam_width]
    return best


class BeamPolicy(Policy):
    """The same beam search as ``beam_search``, one evaluation per ``env.step`` (for the CLI).

    Each ``act`` returns the next pending child of the current level; the next ``act``
    reads its result from ``env.unwrapped.history``. When a level is done, its improving
    children (beating their parent) become the next beam. When nothing is left to try,
    it re-proposes the best schedule (a cache hit).
    """

    name = "beam"

    def __init__(self, beam_width: int = 4, expand: int | None = None):
        self.beam_width, self.expand = beam_width, expand
        self.reset()

    def reset(self) -> None:
        self.beam: list[tuple[dict, float]] | None = None
        self.pending: list[tuple[dict, float]] = []
        self.children: list[tuple[dict, float]] = []
        self.awaiting: tuple[dict, float] | None = None
        self.seen: set = set()
        self.done = False

    def _expand(self, space) -> None:
        for sched, speedup in self.beam:
            moves = [m for m in one_knob_moves(space, sched) if schedule_key(m) not in self.seen]
            for move in moves[:self.expand] if self.expand is not None else moves:
                self.seen.add(schedule_key(move))
                self.pending.append((move, speedup))

    def act(self, env):
        u = env.unwrapped
        if self.awaiting is not None and u.history:
            move, parent_speedup = self.awaiting
            s = u.history[-1]["speedup"]
            if s is not None and s > parent_speedup:
                self.children.append((move, s))
            self.awaiting = None
        if self.beam is None:
            self.beam = [(dict(u.schedule), float(u.current_speedup))]
            self.seen.add(schedule_key(u.schedule))
            self._expand(u.schedule_space)
        if not self.pending and not self.done:
            if self.children:
                self.beam = sorted(self.children, key=lambda c: -c[1])[:self.beam_width]
                self.children = []
                self._expand(u.schedule_space)
            if not self.pending:
                self.done = True
        if self.pending:
            self.awaiting = self.pending.pop(0)
            return schedule_action(env, self.awaiting[0])
        best = u.best[1] if u.best is not None else u.schedule
        return schedule_action(env, best)
