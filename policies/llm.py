"""An LLM policy: any OpenAI-compatible chat endpoint writes the next kernel source."""

from __future__ import annotations

import re

from policies.base import Policy

SYSTEM_PROMPT = """You optimize Pallas TPU kernels for TPU v6e. You are shown a workload, its \
JAX reference, the current Pallas kernel source and how it scored. Propose a faster kernel \
that stays correct (same outputs within tolerance; it must define workload(*inputs)).

Answer with ONE fenced code block at the end of your reply, either:
  * the full new Python module, or
  * one or more search/replace edit blocks against the current source:
<<<<<<< SEARCH
exact text from the current source
=======
replacement text
>>>>>>> REPLACE
Keep explanations short."""

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(reply: str) -> str:
    """The body of the LAST fenced code block in ``reply``, or the whole reply if there is none."""
    blocks = _FENCE.findall(reply or "")
    return blocks[-1] if blocks else (reply or "")


class LLMPolicy(Policy):
    """Asks a chat model for the next source, given ``env.unwrapped.describe()``.

    Works with any OpenAI-compatible endpoint (vLLM, llama.cpp server, OpenAI, ...):
    ``base_url`` like ``http://127.0.0.1:8000/v1``. Pass ``client`` to reuse an existing
    ``openai.OpenAI``. The reply's last fenced code block is the source action (a full
    module or search/replace blocks); in "both" mode the action keeps the current schedule
    indices. ``last_prompt`` and ``last_reply`` hold the latest exchange.
    """

    name = "llm"

    def __init__(self, base_url: str | None = None, model: str = "default", api_key: str = "none",
                 client=None, system_prompt: str = SYSTEM_PROMPT, temperature: float | None = None,
                 max_tokens: int | None = None, timeout: float = 600.0):
        if client is None:
            from openai import OpenAI

            client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout)
        self.client, self.model, self.system_prompt = client, model, system_prompt
        self.temperature, self.max_tokens = temperature, max_tokens
        self.last_prompt: str | None = None
        self.last_reply: str | None = None

    def propose(self, prompt: str) -> str:
        kwargs = {}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        resp = self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": self.system_prompt}, {"role": "user", "content": prompt}],
            **kwargs,
        )
        return resp.choices[0].message.content or ""

    def act(self, env):
        u = env.unwrapped
        self.last_prompt = u.describe()
        self.last_reply = self.propose(self.last_prompt)
        text = extract_code(self.last_reply)
        if u.action_mode == "both":
            return {"schedule": u.schedule_space.encode(u.schedule), "source": text}
        if u.action_mode == "schedule":
            raise ValueError("LLMPolicy needs action_mode 'source' or 'both'")
        return text
