"""An LLM policy: a chat model writes the next kernel, one step at a time.

Each ``act`` builds the prompt of ``policies.llm_prompt`` for the env's current kernel (the
guide sections its category and last error call for, the simulator's breakdown, the history
of this episode's attempts), asks for a plan and then its code (``plan=False``: code only)
and returns the reply's code as the source action. Transport, budget, transcript and replay
are ``policies.llm_client``'s; ``policies.llm_beam`` searches with the same prompts.
"""

from __future__ import annotations

import re

from policies.base import Policy
from policies.llm_client import LLMError, make_client
from policies.llm_prompt import Attempt, Context, code_messages, load_guide, parse_plans, plan_messages

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


class NoCode(ValueError):
    """A reply with neither a fenced code block nor search/replace edits."""


def extract_code(reply: str) -> str:
    """The body of the LAST fenced code block in ``reply``; the reply itself if it holds bare
    search/replace edits; ``NoCode`` otherwise."""
    blocks = _FENCE.findall(reply or "")
    if blocks:
        return blocks[-1]
    if "<<<<<<< SEARCH" in (reply or ""):
        return reply
    raise NoCode("the reply has no fenced code block and no search/replace edits")


class LLMPolicy(Policy):
    """Asks a chat model for the next kernel source.

    ``client``: a ``ChatClient`` or ``ReplayClient`` (``make_client``); or pass ``base_url``,
    ``model``, ``api_key``, ``replay``, ``transcript``, ``max_requests``, ``max_tokens`` to make
    one. After each ``act``: ``last_prompt``, ``last_reply`` and ``last_error`` (why the reply
    gave no candidate, or the request failed: the step then re-proposes the best kernel).
    """

    name = "llm"

    def __init__(self, client=None, plan: bool = True, temperature: float | None = None,
                 max_tokens: int | None = None, guide=None, **client_kwargs):
        self.client = client if client is not None else make_client(**client_kwargs)
        self.plan, self.params = plan, {"temperature": temperature, "max_tokens": max_tokens}
        self.guide = load_guide() if guide is None else guide
        self.reset()

    def reset(self) -> None:
        self.attempts: list[Attempt] = []
        self.awaiting: tuple[str, str | None] | None = None  # (plan, request hash) of the last action
        self.last_prompt = self.last_reply = self.last_error = None

    def _observe(self, u) -> None:
        plan, request = self.awaiting
        self.awaiting = None
        result = u.last
        if result is None:
            return
        self.attempts.append(Attempt.of(plan, result))
        self.client.score(request, result)

    def _action(self, u, text: str):
        if u.action_mode == "both":
            return {"schedule": u.schedule_space.encode(u.schedule), "source": text}
        return text

    def _best(self, u):
        """The best kernel again (a cache hit), for a step whose reply gave no candidate."""
        return self._action(u, u.best[0] if u.best is not None else u.source)

    def act(self, env):
        u = env.unwrapped
        if u.action_mode == "schedule":
            raise ValueError("LLMPolicy needs action_mode 'source' or 'both'")
        if self.awaiting is not None:
            self._observe(u)
        self.last_error = None
        ctx = Context.of(env, history=self.attempts)
        plan = None
        try:
            if self.plan:
                reply = self.client.complete(plan_messages(ctx, 1, self.guide), purpose="plan", **self.params)
                plan = parse_plans(reply.text, 1)[0] if reply.text.strip() else None
            messages = code_messages(ctx, plan, self.guide)
            self.last_prompt = messages[-1]["content"]
            reply = self.client.complete(messages, purpose="code", **self.params)
        except LLMError as e:
            self.last_error = f"request failed: {e}"
            return self._best(u)
        self.last_reply = reply.text
        try:
            text = extract_code(reply.text)
        except NoCode as e:
            self.last_error = str(e)
            self.attempts.append(Attempt(plan or "code", False, None, None, str(e)))
            return self._best(u)
        self.awaiting = (plan or "code", reply.request_hash)
        return self._action(u, text)
