"""Search policies for JAXBench-Gym: each has ``act(env) -> action``.

``make_policy(name, **kwargs)`` builds one by name (the CLI uses it):
"random", "greedy", "beam" (step-by-step beam search; see also ``beam_search`` for
the fork-based function), "gradient" (descent on the simulator's differentiable tier),
"llm" (any OpenAI-compatible chat endpoint) and "expert" (the
workload's hand-tuned kernel shipped in jax, where JAXBench names one).
"""

from __future__ import annotations

from policies.base import Policy, run_policy
from policies.beam import BeamPolicy, beam_search
from policies.expert import ExpertPolicy
from policies.gradient import GradientPolicy
from policies.greedy import GreedyPolicy
from policies.random_search import RandomPolicy


def _llm(**kw):
    from policies.llm import LLMPolicy  # imports openai only when asked for

    return LLMPolicy(**kw)


POLICIES = {
    "random": RandomPolicy,
    "greedy": GreedyPolicy,
    "beam": BeamPolicy,
    "gradient": GradientPolicy,
    "llm": _llm,
    "expert": ExpertPolicy,
}

# The action mode each policy acts in.
POLICY_ACTION_MODE = {"random": "schedule", "greedy": "schedule", "beam": "schedule", "gradient": "schedule",
                      "llm": "source", "expert": "source"}


def make_policy(name: str, **kwargs) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(**kwargs)


__all__ = ["POLICIES", "POLICY_ACTION_MODE", "make_policy", "run_policy", "Policy", "RandomPolicy",
           "GreedyPolicy", "GradientPolicy", "BeamPolicy", "ExpertPolicy", "beam_search"]
