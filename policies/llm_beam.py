"""Plan-then-code beam search with a chat model (Autocomp's search, this project's loop).

``PlanThenCode`` is a proposer for ``policies.beam.BeamPolicy``: for each beam member one
request asks for ``n_plans`` plans (each a strategy from ``llm_prompt.STRATEGIES`` made
concrete for that kernel, with its profile and the history in view), then one request per
plan asks for its code. Requests run ``concurrency`` at a time. A reply becomes a proposal
when its code applies to the member's source; a reply with no code, edits that do not apply,
a repeat of an earlier candidate, or a request that fails are recorded as failed attempts (``failures``, the history the next
prompts show, and the transcript) without costing an evaluation.

    policy = make_llm_beam(client, beam_width=2, n_plans=2)   # a BeamPolicy
    run_policy(policy, env, steps=16)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from action_space.source_edit import EditError, apply_source_action, read_schedule
from policies.base import schedule_key
from policies.beam import BeamPolicy, Member, Proposal
from policies.llm import NoCode, extract_code
from policies.llm_client import BudgetExhausted, LLMError
from policies.llm_prompt import (PROMPT_TOKEN_BUDGET, Attempt, Context, code_messages, load_guide, parse_plans,
                                 plan_messages)


class PlanThenCode:
    """Proposes children of beam members by asking a chat model for plans, then code."""

    def __init__(self, client, n_plans: int = 2, concurrency: int = 4, temperature: float | None = None,
                 max_tokens: int | None = None, guide=None, budget_tokens: int | None = None):
        self.client, self.n_plans, self.concurrency = client, n_plans, max(1, concurrency)
        self.params = {"temperature": temperature, "max_tokens": max_tokens}
        self.guide = load_guide() if guide is None else guide
        self.budget_tokens = PROMPT_TOKEN_BUDGET if budget_tokens is None else budget_tokens
        self.reset()

    def reset(self) -> None:
        self.attempts: list[Attempt] = []
        self.failures: list[dict] = []  # {"plan", "error", "request"} of replies that made no proposal
        self.exhausted: str | None = None  # why no more requests are made (budget)
        self.proposed: set = set()  # (source, schedule) of every proposal and beam member

    def _ask(self, messages, purpose):
        return self.client.complete(messages, purpose=purpose, **self.params)

    def _fail(self, plan: str, error: str, request: str | None) -> None:
        self.failures.append({"plan": plan, "error": error, "request": request})
        self.attempts.append(Attempt(plan, False, None, None, error))
        self.client.score(request, {"correct": False, "compiled": False, "error": error})

    def _run(self, jobs):
        """Run ``jobs`` (callables) ``concurrency`` at a time; their results, or the exception raised."""
        def guard(job):
            try:
                return job()
            except LLMError as e:
                return e
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(guard, jobs))

    def propose(self, members: list[Member], env) -> list[tuple[Member, Proposal]]:
        if self.exhausted:
            return []
        self.proposed.update((m.source, schedule_key(m.schedule)) for m in members)
        contexts = [Context.of(env, m.source, m.details, self.attempts, m.error) for m in members]
        plan_replies = self._run([
            (lambda c=c: self._ask(plan_messages(c, self.n_plans, self.guide, self.budget_tokens), "plan"))
            for c in contexts])
        jobs, owners = [], []
        for member, ctx, reply in zip(members, contexts, plan_replies):
            if isinstance(reply, LLMError):
                self._note_error(reply, "plan request")
                continue
            for plan in parse_plans(reply.text, self.n_plans):
                jobs.append(lambda c=ctx, p=plan: (p, self._ask(code_messages(c, p, self.guide, self.budget_tokens),
                                                                "code")))
                owners.append(member)
        out = []
        for member, result in zip(owners, self._run(jobs)):
            if isinstance(result, LLMError):
                self._note_error(result, "code request")
                continue
            plan, reply = result
            try:
                source = apply_source_action(member.source, extract_code(reply.text))
            except (NoCode, EditError) as e:
                self._fail(plan, f"the reply made no candidate: {e}", reply.request_hash)
                continue
            own = read_schedule(source) or {}
            schedule = {**member.schedule, **{k: v for k, v in own.items() if k in member.schedule}}
            key = (source, schedule_key(schedule))
            if key in self.proposed:  # the same kernel again: not worth an evaluation
                self._fail(plan, "the reply repeats an earlier candidate", reply.request_hash)
                continue
            self.proposed.add(key)
            out.append((member, Proposal(source, schedule, plan, reply.request_hash)))
        return out

    def _note_error(self, error: LLMError, what: str) -> None:
        if isinstance(error, BudgetExhausted):
            self.exhausted = str(error)
        self._fail(what, f"{what} failed: {error}", None)

    def observe(self, proposal: Proposal, result) -> None:
        self.attempts.append(Attempt.of(proposal.summary, result))
        self.client.score(proposal.request, result)


def make_llm_beam(client, beam_width: int = 2, n_plans: int = 2, depth: int | None = None,
                  concurrency: int = 4, **kwargs) -> BeamPolicy:
    """A ``BeamPolicy`` whose proposer is ``PlanThenCode``."""
    policy = BeamPolicy(beam_width, depth=depth, proposer=PlanThenCode(client, n_plans, concurrency, **kwargs))
    policy.name = "llm-beam"
    return policy
