"""What every policy shares: the ``act(env) -> action`` interface and a run loop.

A policy is any object with ``act(env)``: it looks at the environment (``env.unwrapped``
gives the ``JAXBenchEnv`` with its schedule, history, ``describe()`` and ``fork()``) and
returns one action for ``env.step``. ``run_policy`` drives one for a number of steps.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np


def schedule_key(schedule: Mapping[str, Any], space=None) -> tuple:
    """A hashable key of ``schedule``; with its ``space``, leaving out the knobs the schedule
    leaves unused (``space.inert``), so schedules that build the same program share one key
    and a search does not spend a step on a program it has priced."""
    inert = space.inert(schedule) if space is not None else ()
    return tuple(sorted((k, v) for k, v in schedule.items() if k not in inert))


def local_moves(space, schedule: Mapping[str, Any]) -> Iterator[dict]:
    """Schedules one knob away from ``schedule`` that ``space.check`` allows (the env's
    action mask at ``schedule``), nearest values first: every knob's +-1 index moves, then
    +-2, and so on. A move the mask rejects is repaired where it can be: with one other
    knob at its nearest value that makes it legal (every such repair at the least distance),
    after the legal moves of its distance. A structural move (all of K in one step, say)
    often needs smaller blocks to fit VMEM: without repairs, a search that moves one knob at
    a time never reaches it. Knobs the schedule leaves unused (``space.inert``) are not
    moved: the program would be the same."""
    current = space.encode(schedule)
    inert = space.inert(schedule)
    for dist in range(1, int(space.nvec.max(initial=1))):
        rejected = []
        for i, knob in enumerate(space.knobs):
            if knob.name in inert:
                continue
            for j in (current[i] - dist, current[i] + dist):
                if 0 <= j < len(knob.values):
                    cand = {**schedule, knob.name: knob.values[j]}
                    if space.check(cand) is None:
                        yield cand
                    else:
                        rejected.append((cand, i))
        for cand, i in rejected:
            yield from _repairs(space, cand, current, moved=i)


def _repairs(space, cand: dict, current, moved: int) -> list[dict]:
    """``cand`` made legal by one other knob at its nearest legal value, the nearest repairs."""
    found: dict[int, list[dict]] = {}
    for i, knob in enumerate(space.knobs):
        if i == moved:
            continue
        for dist in range(1, len(knob.values)):
            legal = [{**cand, knob.name: knob.values[j]} for j in (current[i] - dist, current[i] + dist)
                     if 0 <= j < len(knob.values)]
            legal = [c for c in legal if space.check(c) is None]
            if legal:
                found.setdefault(dist, []).extend(legal)
                break
    return found[min(found)] if found else []


class Policy:
    """Base class: subclasses implement ``act``; ``run`` steps an env with it."""

    name = "policy"

    def act(self, env):  # pragma: no cover - interface
        raise NotImplementedError

    def reset(self) -> None:
        """Forget per-episode state (called by ``run`` after ``env.reset``)."""

    def run(self, env, steps: int, seed: int | None = None, callback: Callable[[dict], None] | None = None):
        return run_policy(self, env, steps, seed=seed, callback=callback)


def schedule_action(env, schedule: Mapping[str, Any]):
    """The env action that evaluates ``schedule`` with the current source, for any action mode."""
    u = env.unwrapped
    idx = u.schedule_space.encode(schedule)
    if u.action_mode == "both":
        return {"schedule": idx, "source": ""}
    return idx


def jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def run_policy(policy, env, steps: int, seed: int | None = None, reset: bool = True,
               callback: Callable[[dict], None] | None = None) -> list[dict]:
    """Reset ``env`` (unless ``reset=False``), then take ``steps`` steps with ``policy``.

    Returns one record per step: step, action, schedule, reward, speedup, correct,
    compiled, time_ms, baseline_ms, error, timing_source, trusted_timing, cached, wall_s (the
    policy's choice and the evaluation), and an LLM policy's prompt, reply and policy_error (why a
    reply gave no candidate). ``callback`` sees each record as
    it is made (for progress output). Stops early if the episode ends.
    """
    if reset:
        env.reset(seed=seed)
        if hasattr(policy, "reset"):
            policy.reset()
    records = []
    for n in range(1, steps + 1):
        t0 = time.perf_counter()
        action = policy.act(env)
        _, reward, terminated, truncated, info = env.step(action)
        rec = {"step": n, "action": jsonable(action), "schedule": jsonable(info["schedule"]),
               "reward": float(reward), "speedup": info["speedup"], "correct": info["correct"],
               "compiled": bool(info["compiled"]), "time_ms": info["time_ms"],
               "baseline_ms": info["baseline_ms"], "error": info["error"],
               "timing_source": info["timing_source"], "trusted_timing": info.get("trusted_timing"),
               "cached": info.get("cached"), "wall_s": time.perf_counter() - t0}
        for key in ("last_prompt", "last_reply", "last_error"):  # an LLM policy's exchange for this step
            if getattr(policy, key, None) is not None:
                rec[{"last_error": "policy_error"}.get(key, key.removeprefix("last_"))] = getattr(policy, key)
        records.append(rec)
        if callback is not None:
            callback(rec)
        if terminated or truncated:
            break
    return records
