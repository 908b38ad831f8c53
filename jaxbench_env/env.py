"""The Gymnasium environment: one JAXBench workload, optimized one candidate per step."""

from __future__ import annotations

import copy
import inspect
import string
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from action_space.source_edit import MAX_SOURCE_CHARS, EditError, apply_source_action, read_schedule
from jaxbench_env.candidate import Candidate
from jaxbench_env.evaluation import EvalResult, Evaluator, reward_of
from workloads.base import N_FEATURES

ACTION_MODES = ("schedule", "source", "both")
REWARDS = ("speedup", "log_speedup", "improvement")
SOURCE_CHARSET = string.printable  # letters, digits, punctuation and whitespace
MAX_SPEEDUP_OBS = 1e3


class JAXBenchEnv(gym.Env):
    """Optimize a Pallas TPU kernel for one JAXBench workload.

    An episode starts from the workload's baseline Pallas template at its default
    schedule (the nearest valid one, for a config too small for the default blocks). Each step proposes a candidate, evaluates it (v6e compile, correctness
    check, time) and, if it compiled and is correct, makes it the current kernel.

    Actions (``action_mode``):
        * "schedule": ``MultiDiscrete`` of knob-value indices, applied to the current source.
        * "source": ``Text``: a whole module defining ``workload(*inputs)``, or search/replace
          edit blocks against the current source (see ``action_space.source_edit``). The
          values in the new module's ``SCHEDULE`` literal become the current schedule.
        * "both": ``Dict(schedule=..., source=...)``; an empty source keeps the current one,
          and the schedule action wins over the module's ``SCHEDULE`` literal.

    Observation (``Dict``):
        * "features": log2 of the workload's config numbers (fixed size 16, zero padded).
        * "schedule": current knob-value indices.
        * "last_speedup", "best_speedup": XLA baseline time / candidate time (0 if failed).
        * "last_correct": 1 if the last candidate compiled and was correct.
        * "step": steps taken this episode.
        * "action_mask": 1 for each knob value that the schedule space allows as a one-knob
          move from the current schedule (knob order, values concatenated).

    Reward: ``t_xla / t_candidate`` ("speedup"), its log ("log_speedup"), or the change in
    speedup over the current kernel ("improvement"); ``penalty`` for a candidate that does
    not compile, is wrong, or cannot be built from the action. ``info`` always holds
    speedup, correct, compiled, timing_source, error, time_ms, baseline_ms, source,
    schedule, max_abs_err and checked; times are predictions when timing_source is "v6e-sim".

    ``timing_only=True`` is for exploring a schedule space fast: a schedule applied to the
    workload's own template is compiled and timed but not run through the interpret check
    (``info["checked"]`` is False, ``correct`` None), on the premise that every schedule
    the space allows is a correct program. Check what a search returns with
    ``check_best()``. Source actions are always checked.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, workload: str, backend: str = "auto", action_mode: str = "schedule",
                 max_steps: int = 32, penalty: float = -1.0, reward: str = "speedup",
                 config: Mapping[str, Any] | None = None, seed: int | None = None,
                 render_mode: str | None = None, cache_dir=None, timeout_s: float = 300.0,
                 evaluator: Evaluator | None = None, timing_only: bool = False):
        if action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {action_mode!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.evaluator = evaluator or Evaluator(workload, config, backend, cache_dir=cache_dir, timeout_s=timeout_s)
        self.workload = self.evaluator.workload
        self.schedule_space = self.workload.schedule_space()
        self.action_mode, self.max_steps, self.penalty, self.reward_mode = action_mode, max_steps, penalty, reward
        self.render_mode, self.timing_only = render_mode, timing_only
        self._seed, self._seeded = seed, False

        sched = self.schedule_space.gym_space()
        text = spaces.Text(max_length=MAX_SOURCE_CHARS, charset=SOURCE_CHARSET)
        self.action_space = {"schedule": sched, "source": text,
                             "both": spaces.Dict({"schedule": sched, "source": text})}[action_mode]
        self.observation_space = spaces.Dict({
            "features": spaces.Box(-64.0, 64.0, (N_FEATURES,), np.float32),
            "schedule": copy.deepcopy(sched),
            "last_speedup": spaces.Box(0.0, MAX_SPEEDUP_OBS, (1,), np.float32),
            "best_speedup": spaces.Box(0.0, MAX_SPEEDUP_OBS, (1,), np.float32),
            "last_correct": spaces.Box(0.0, 1.0, (1,), np.float32),
            "step": spaces.Box(0.0, float(max_steps), (1,), np.float32),
            "action_mask": spaces.MultiBinary(int(self.schedule_space.nvec.sum()) or 1),
        })
        self._template = self.workload.template_source()
        try:
            self._start_schedule = self.schedule_space.nearest_valid(self.schedule_space.default())
        except ValueError:  # the template cannot serve this config: reset says why; source actions still work
            self._start_schedule = self.schedule_space.default()
        self._reset_state()

    # --- state -------------------------------------------------------------------------
    def _reset_state(self) -> None:
        self.source = self._template
        self.schedule = self._start_schedule
        self.steps = 0
        self.last: EvalResult | None = None
        self.current_speedup = 0.0
        self.best_speedup = 0.0
        self.best: tuple[str, dict] | None = None
        self.history: list[dict] = []

    def get_state(self) -> dict:
        return copy.deepcopy({k: getattr(self, k) for k in
                              ("source", "schedule", "steps", "last", "current_speedup", "best_speedup", "best", "history")})

    def set_state(self, state: Mapping[str, Any]) -> None:
        for k, v in copy.deepcopy(dict(state)).items():
            setattr(self, k, v)

    def fork(self) -> "JAXBenchEnv":
        """A copy at the same state, sharing the evaluator (worker and cache): for search."""
        child = JAXBenchEnv(self.workload.name, action_mode=self.action_mode, max_steps=self.max_steps,
                            penalty=self.penalty, reward=self.reward_mode, render_mode=self.render_mode,
                            evaluator=self.evaluator, timing_only=self.timing_only)
        child.set_state(self.get_state())
        return child

    # --- gym API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and not self._seeded:
            seed = self._seed  # the make-time seed applies to the first reset
        super().reset(seed=seed)
        self._seeded = True
        self.action_space.seed(int(self.np_random.integers(2**31)))
        self._reset_state()
        reason = self.schedule_space.check(self.schedule)
        start = self._failure(f"the template cannot serve this config: {reason}", "schedule") if reason \
            else self._evaluate(self.source, self.schedule)
        self.last = start
        self.current_speedup = self.best_speedup = start.speedup or 0.0
        self.best = (self.source, dict(self.schedule)) if start.ok else None
        return self._observation(), self._info(start, self.source, self.schedule)

    def step(self, action):
        self.steps += 1
        source, schedule = self.source, dict(self.schedule)
        try:
            source, schedule = self._decode(action)
        except (EditError, ValueError, TypeError, KeyError) as e:
            result = self._failure(f"invalid action: {e}", "action")
        else:
            result = self._evaluate(source, schedule)
        reward = reward_of(result, self.reward_mode, self.penalty, self.current_speedup)
        self.last = result
        if result.ok:
            self.source, self.schedule = source, schedule
            self.current_speedup = result.speedup
            if result.speedup > self.best_speedup:
                self.best_speedup, self.best = result.speedup, (source, dict(schedule))
        info = self._info(result, source, schedule)
        self.history.append({k: info[k] for k in ("speedup", "correct", "compiled", "time_ms", "error", "schedule")}
                            | {"step": self.steps, "reward": reward})
        truncated = self.steps >= self.max_steps
        return self._observation(), reward, False, truncated, info

    def _decode(self, action) -> tuple[str, dict]:
        if self.action_mode == "schedule":
            return self.source, self.schedule_space.decode(action)
        if self.action_mode == "source":
            # An edit of the module's SCHEDULE literal is how a source action tunes knobs.
            source = apply_source_action(self.source, action)
            own = read_schedule(source) or {}
            return source, {**self.schedule, **{k: v for k, v in own.items() if k in self.schedule}}
        if not isinstance(action, Mapping) or set(action) != {"schedule", "source"}:
            raise ValueError("a 'both' action is a dict with keys 'schedule' and 'source'")
        schedule = self.schedule_space.decode(action["schedule"])
        text = action["source"]
        source = self.source if isinstance(text, str) and text == "" else apply_source_action(self.source, text)
        return source, schedule

    def _evaluate(self, source: str, schedule: dict) -> EvalResult:
        reason = self.schedule_space.check(schedule) if source == self._template else None
        if reason is not None:  # certain to fail: save the compile, report why
            return self._failure(f"schedule rejected: {reason}", "schedule")
        return self.evaluator.evaluate(Candidate(source, schedule), check=not (self.timing_only and source == self._template))

    def check_best(self) -> EvalResult | None:
        """The best candidate so far evaluated with the correctness check (None before any)."""
        return None if self.best is None else self.evaluator.evaluate(Candidate(*self.best))

    def _failure(self, error: str, stage: str) -> EvalResult:
        """The result of an action that never reached the evaluator."""
        return EvalResult(self.workload.name, self.evaluator.backend, self.evaluator.timing_source,
                          compiled=False, correct=False, error=error, stage=stage,
                          baseline_ms=self.evaluator.baseline().time_ms)

    # --- observations and text ------------------------------------------------------------
    def _observation(self) -> dict:
        def box(x):
            return np.array([min(max(float(x), 0.0), MAX_SPEEDUP_OBS)], dtype=np.float32)

        last = self.last.speedup if self.last is not None else None
        return {
            "features": self.workload.features(),
            "schedule": self.schedule_space.encode(self.schedule),
            "last_speedup": box(last or 0.0),
            "best_speedup": box(self.best_speedup),
            "last_correct": box(1.0 if self.last is not None and self.last.ok else 0.0),
            "step": np.array([min(self.steps, self.max_steps)], dtype=np.float32),
            "action_mask": self.schedule_space.mask(self.schedule),
        }

    def _info(self, result: EvalResult, source: str, schedule: dict) -> dict:
        return {
            "speedup": result.speedup, "correct": result.correct, "compiled": result.compiled,
            "timing_source": result.timing_source, "error": result.error, "time_ms": result.time_ms,
            "baseline_ms": result.baseline_ms, "max_abs_err": result.max_abs_err, "cached": result.cached,
            "source": source, "schedule": dict(schedule), "workload": self.workload.name,
            "backend": self.evaluator.backend, "trusted_timing": result.trusted_timing,
            "checked": result.correct is not None,
        }

    def action_masks(self) -> tuple:
        """Per-knob masks for ``MultiDiscrete.sample(mask=...)``."""
        return self.schedule_space.split_mask(self.schedule_space.mask(self.schedule))

    def reference_source(self) -> str:
        return inspect.getsource(type(self.workload).reference)

    def describe(self) -> str:
        """The current state as prompt-ready text for an LLM policy."""
        wl, last = self.workload, self.last
        predicted = " (predicted by the v6e simulator)" if self.evaluator.backend == "sim" else " (measured)"
        lines = [
            f"# Workload {wl.name} ({wl.jaxbench_id}): {wl.description}",
            f"Config: {wl.config}",
            "Correctness: allclose(atol={}, rtol={}) against the reference{}, 3 random seeds.".format(
                *wl.tolerance(wl.config), " computed in float32 (widened to the bf16 reference's own error)"
                if wl.float32_check and wl.config.get("dtype") != "float32" else ""),
            f"XLA baseline time: {self.evaluator.baseline().time_ms:.4f} ms{predicted}",
            f"Current speedup: {self.current_speedup:.3f}x; best so far: {self.best_speedup:.3f}x; "
            f"step {self.steps}/{self.max_steps}",
            "Schedule knobs (SCHEDULE dict keys and legal values):",
            *(f"  {k.name}: {list(k.values)} (now {self.schedule.get(k.name)!r}) - {k.doc}" for k in self.schedule_space.knobs),
        ]
        if last is not None:
            status = "ok" if last.ok else "FAILED"
            t = f"{last.time_ms:.4f} ms" if last.time_ms is not None else "n/a"
            lines.append(f"Last candidate: {status}, time {t}, max abs err {last.max_abs_err}")
            if last.error:
                lines.append(f"Last error:\n{last.error}")
        lines += ["", "## Reference (the XLA baseline)", "```python", self.reference_source().rstrip(), "```",
                  "", "## Current kernel source", "```python", self.source.rstrip(), "```"]
        return "\n".join(lines)

    def render(self):
        if self.render_mode == "ansi":
            return self.describe()
        return None

    def close(self):
        self.evaluator.close()
        super().close()
