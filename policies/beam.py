"""Beam search, Autocomp-style: a child is kept only if it beats its parent.

One loop (``BeamPolicy``) serves every proposer: ``ScheduleMoves`` proposes local schedule
moves, ``policies.llm_beam.PlanThenCode`` asks a chat model for plans and then code. Each
level, every beam member gets its proposals; each is evaluated (one ``env.step``); the
children that beat their parent become candidates for the next beam, of which the best
``beam_width`` are kept. ``beam_search`` runs the same loop on a ``fork()`` of an env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from action_space.source_edit import read_schedule, with_schedule
from policies.base import Policy, local_moves, schedule_key


@dataclass
class Member:
    """A kernel in the beam: its source, schedule, speedup and the details of its evaluation."""

    source: str
    schedule: dict
    speedup: float
    details: dict | None = None
    error: str | None = None


@dataclass
class Proposal:
    """A child to evaluate: a whole source and schedule, what it tries, and the request it
    came from (an LLM reply's hash, for the transcript's score)."""

    source: str
    schedule: dict
    summary: str
    request: str | None = None
    meta: dict = field(default_factory=dict)


def action_for(env, source: str, schedule: dict):
    """The env action that evaluates ``source`` at ``schedule`` in the env's action mode."""
    u = env.unwrapped
    if u.action_mode == "schedule":
        if source != u.source:
            raise ValueError("a source proposal needs action_mode 'source' or 'both'")
        return u.schedule_space.encode(schedule)
    if u.action_mode == "both":
        return {"schedule": u.schedule_space.encode(schedule), "source": "" if source == u.source else source}
    return source if read_schedule(source) == schedule else with_schedule(source, schedule)


class ScheduleMoves:
    """Proposes every local move (``local_moves``) of each member's schedule that no
    member has tried (nearest values first; at most ``expand`` per member)."""

    def __init__(self, expand: int | None = None):
        self.expand = expand
        self.seen: set = set()

    def reset(self) -> None:
        self.seen = set()

    def propose(self, members: list[Member], env) -> list[tuple[Member, Proposal]]:
        space = env.unwrapped.schedule_space
        out = []
        for m in members:
            self.seen.add(schedule_key(m.schedule, space))
            moves = [s for s in local_moves(space, m.schedule) if schedule_key(s, space) not in self.seen]
            for move in moves[:self.expand] if self.expand is not None else moves:
                self.seen.add(schedule_key(move, space))
                out.append((m, Proposal(m.source, move, f"schedule {move}")))
        return out

    def observe(self, proposal: Proposal, result) -> None:
        """Told each proposal's result (an ``EvalResult``)."""


class BeamPolicy(Policy):
    """Beam search one evaluation per ``env.step`` (the CLI's and ``beam_search``'s loop).

    Each ``act`` returns the next pending proposal of the current level; the next ``act``
    reads its result from ``env.unwrapped.last``. When a level is done, its improving children
    (beating their parent) become the next beam, up to ``depth`` levels (None: until no child
    improves). When nothing is left, it re-proposes the best kernel (a cache hit); ``done``
    says so. ``best`` is the best ``Member`` seen, the root included.
    """

    name = "beam"

    def __init__(self, beam_width: int = 4, expand: int | None = None, depth: int | None = None,
                 proposer=None):
        self.beam_width, self.depth = beam_width, depth
        self.proposer = proposer if proposer is not None else ScheduleMoves(expand)
        self.reset()

    def reset(self) -> None:
        self.beam: list[Member] | None = None
        self.pending: list[tuple[Member, Proposal]] = []
        self.children: list[Member] = []
        self.awaiting: tuple[Member, Proposal] | None = None
        self.best: Member | None = None
        self.level = 0
        self.done = False
        if hasattr(self.proposer, "reset"):
            self.proposer.reset()

    def _observe(self, u) -> None:
        parent, proposal = self.awaiting
        self.awaiting = None
        result = u.last
        self.proposer.observe(proposal, result)
        if result is not None and result.ok and result.speedup > parent.speedup:
            child = Member(proposal.source, dict(proposal.schedule), float(result.speedup), result.details)
            self.children.append(child)
            if child.speedup > self.best.speedup:
                self.best = child

    def _next_level(self, env) -> None:
        if self.children and (self.depth is None or self.level < self.depth):
            self.beam = sorted(self.children, key=lambda c: -c.speedup)[:self.beam_width]
            self.children = []
            self.level += 1
            self.pending = list(self.proposer.propose(self.beam, env))

    def act(self, env):
        u = env.unwrapped
        if self.awaiting is not None:
            self._observe(u)
        if self.beam is None:
            root = Member(u.source, dict(u.schedule), float(u.current_speedup),
                          u.last.details if u.last is not None else None)
            self.beam, self.best, self.level = [root], root, 1
            self.pending = list(self.proposer.propose(self.beam, env))
        if not self.pending and not self.done:
            self._next_level(env)
            if not self.pending:
                self.done = True
        if self.pending:
            self.awaiting = self.pending.pop(0)
            return action_for(env, self.awaiting[1].source, self.awaiting[1].schedule)
        return action_for(env, self.best.source, self.best.schedule)


def beam_search(env, beam_width: int = 4, depth: int = 2, expand: int | None = None,
                callback: Callable[[dict, float | None], None] | None = None,
                proposer=None) -> tuple[dict, float]:
    """``BeamPolicy`` run to its end on a ``fork()`` of ``env`` (the env itself is untouched).

    The root is the env's current kernel (the env is reset first if it has not been); the
    default proposer is ``ScheduleMoves(expand)``. ``callback(schedule, speedup)`` sees every
    evaluation. Returns the best (schedule, speedup) seen, the root included; with a source
    proposer, ``policy.best.source`` holds the source too (use ``BeamPolicy`` directly).
    """
    root = env.unwrapped
    if root.last is None:
        env.reset()
    node = root.fork()
    policy = BeamPolicy(beam_width, expand, depth=depth, proposer=proposer)
    while True:
        action = policy.act(node)
        if policy.done:
            break
        _, _, _, _, info = node.step(action)
        if callback is not None:
            callback(dict(info["schedule"]), info["speedup"])
    return dict(policy.best.schedule), float(policy.best.speedup)
