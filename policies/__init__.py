"""Search policies for JAXBench-Gym: each has ``act(env) -> action``.

``make_policy(name, **kwargs)`` builds one by name (the CLI uses it):
"random", "greedy", "beam" (step-by-step beam search; see also ``beam_search`` for
the fork-based function), "gradient" (descent on the simulator's differentiable tier),
"llm" (any OpenAI-compatible chat endpoint, one kernel per step), "llm-beam" (plan-then-code
beam search with the same endpoint) and "expert" (the
workload's hand-tuned kernel shipped in jax, where JAXBench names one).
"""

from __future__ import annotations

from policies.base import Policy, run_policy
from policies.beam import BeamPolicy, beam_search
from policies.expert import ExpertPolicy
from policies.gradient import GradientPolicy
from policies.greedy import GreedyPolicy
from policies.random_search import RandomPolicy


CLIENT_OPTIONS = ("base_url", "model", "api_key", "replay", "transcript", "max_requests", "max_total_tokens")


def _client(kw: dict):
    from policies.llm_client import make_client

    return make_client(**{k: kw.pop(k) for k in CLIENT_OPTIONS if k in kw})


def _llm(**kw):
    from policies.llm import LLMPolicy

    return LLMPolicy(_client(kw), **kw)


def _llm_beam(**kw):
    from policies.llm_beam import make_llm_beam

    return make_llm_beam(_client(kw), **kw)


POLICIES = {
    "random": RandomPolicy,
    "greedy": GreedyPolicy,
    "beam": BeamPolicy,
    "gradient": GradientPolicy,
    "llm": _llm,
    "llm-beam": _llm_beam,
    "expert": ExpertPolicy,
}

# The action mode each policy acts in.
POLICY_ACTION_MODE = {"random": "schedule", "greedy": "schedule", "beam": "schedule", "gradient": "schedule",
                      "llm": "source", "llm-beam": "source", "expert": "source"}


def make_policy(name: str, **kwargs) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(**kwargs)


__all__ = ["POLICIES", "POLICY_ACTION_MODE", "make_policy", "run_policy", "Policy", "RandomPolicy",
           "GreedyPolicy", "GradientPolicy", "BeamPolicy", "ExpertPolicy", "beam_search"]
