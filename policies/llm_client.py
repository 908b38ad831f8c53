"""Talking to a chat model: an OpenAI-compatible HTTP client, a budget, a transcript and replay.

``ChatClient`` posts to ``{base_url}/chat/completions`` (vLLM, llama.cpp's server, Ollama,
hosted APIs) and retries transport errors, rate limits (429) and server errors (5xx) with
exponential backoff, honouring ``Retry-After``. The key is read from the argument or
``OPENAI_API_KEY`` and goes only into the request's ``Authorization`` header: never into a
transcript, a log or (the sandbox keeps a fixed list of variables) a candidate's environment.

``Transcript`` appends every exchange to a JSONL file as it happens: the request (model,
messages, sampling parameters), its hash, the reply, token counts, latency and the versions
that scored it (jax, libtpu, the simulator's calibration); the score of the candidate built
from a reply is appended later as its own record, keyed by the request hash.

``ReplayClient`` answers from such a file without any endpoint: a request gets the reply
recorded for the same hash (in recorded order when one request was made several times), so
requests may be in flight in any order. ``replay_check`` compares the scores a replay gets
with the recorded ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)


class LLMError(RuntimeError):
    """A request that cannot succeed (bad URL, auth, a non-retryable status, retries exhausted)."""


class BudgetExhausted(LLMError):
    """The run's request or token budget is spent."""


@dataclass
class Reply:
    text: str
    model: str  # the model asked for (part of the request's hash)
    served_model: str | None  # the model the endpoint says answered
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    request_hash: str
    replayed: bool = False


def request_hash(model: str, messages: list[dict], params: dict) -> str:
    """What a request is, for replay: model, messages and sampling parameters, canonical JSON."""
    body = json.dumps({"model": model, "messages": messages, "params": params}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def versions() -> dict:
    """The versions that score a reply's candidate (the evaluator's, and the simulator's
    calibration): a replay under others may score differently."""
    from jaxbench_env.evaluation import package_versions

    out = package_versions()
    try:
        from jaxbench_env.sim import calibration

        out["calibration"] = calibration().version
    except Exception:  # a broken calibration file must not stop a transcript
        out["calibration"] = None
    return out


@dataclass
class Budget:
    """At most ``max_requests`` requests and ``max_tokens`` tokens (prompt + completion) per run."""

    max_requests: int | None = None
    max_tokens: int | None = None
    requests: int = 0
    tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reserve(self) -> None:
        with self._lock:
            if self.max_requests is not None and self.requests >= self.max_requests:
                raise BudgetExhausted(f"request budget spent ({self.max_requests} requests)")
            if self.max_tokens is not None and self.tokens >= self.max_tokens:
                raise BudgetExhausted(f"token budget spent ({self.tokens} of {self.max_tokens} tokens)")
            self.requests += 1

    def spend(self, reply: Reply) -> None:
        with self._lock:
            self.tokens += (reply.prompt_tokens or 0) + (reply.completion_tokens or 0)


class Transcript:
    """An append-only JSONL record of a run's exchanges and scores (thread-safe)."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.versions = versions()
        self._write({"type": "run", "versions": self.versions, "time": time.time()})

    def _write(self, record: dict) -> None:
        line = json.dumps(record, default=str)
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")

    def exchange(self, messages: list[dict], params: dict, reply: Reply, purpose: str) -> None:
        self._write({"type": "exchange", "hash": reply.request_hash, "purpose": purpose, "model": reply.model,
                     "served_model": reply.served_model, "params": params, "messages": messages, "reply": reply.text,
                     "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                     "latency_s": round(reply.latency_s, 4), "replayed": reply.replayed,
                     "versions": self.versions})

    def score(self, request: str, result) -> None:
        """The score of the candidate built from ``request``'s reply: an ``EvalResult`` or a dict."""
        keep = ("speedup", "correct", "compiled", "time_ms", "error", "timing_source")
        get = result.get if isinstance(result, dict) else lambda k: getattr(result, k, None)
        self._write({"type": "score", "hash": request, **{k: get(k) for k in keep}})


def read_transcript(path) -> list[dict]:
    """The records of a transcript; a torn last line (a run killed mid-write) is skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class _Recorded:
    """What both clients share: the transcript a candidate's score goes to."""

    transcript: Transcript | None = None

    def score(self, request: str | None, result) -> None:
        """Record the score of the candidate built from ``request``'s reply (if recording)."""
        if self.transcript is not None and request is not None:
            self.transcript.score(request, result)


class ChatClient(_Recorded):
    """An OpenAI-compatible chat endpoint with retries, a budget and an optional transcript."""

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 budget: Budget | None = None, transcript: Transcript | None = None):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise LLMError("no endpoint: pass --base-url or set OPENAI_BASE_URL")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model or os.environ.get("OPENAI_MODEL") or "default"
        self._key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.budget = budget or Budget()
        self.transcript = transcript

    def __repr__(self) -> str:  # no key in reprs, logs or tracebacks
        return f"ChatClient(url={self.url!r}, model={self.model!r})"

    def _post(self, body: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._key and self._key != "none":
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8", errors="replace"))

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        try:
            delay = float(retry_after) if retry_after is not None else None
        except ValueError:
            delay = None
        if delay is None:
            delay = self.backoff_s * 2 ** attempt * (0.5 + random.random() / 2)
        time.sleep(min(max(delay, 0.0), self.max_backoff_s))

    def complete(self, messages: list[dict], purpose: str = "code", **params) -> Reply:
        """One chat completion. ``params``: sampling options (temperature, max_tokens, ...)."""
        params = {k: v for k, v in params.items() if v is not None}
        digest = request_hash(self.model, messages, params)
        self.budget.reserve()
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        t0, last_error = time.perf_counter(), None
        for attempt in range(self.max_retries + 1):
            try:
                data = self._post(body)
                break
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", errors="replace")
                last_error = f"HTTP {e.code} from {self.url}: {detail}"
                if e.code not in RETRY_STATUS:
                    raise LLMError(last_error) from None
                retry_after = e.headers.get("Retry-After") if e.headers else None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                last_error, retry_after = f"cannot reach {self.url}: {getattr(e, 'reason', e)}", None
            except json.JSONDecodeError as e:
                last_error, retry_after = f"{self.url} replied with something that is not JSON: {e}", None
            if attempt < self.max_retries:
                self._wait(attempt, retry_after)
        else:
            raise LLMError(f"{last_error} (gave up after {self.max_retries + 1} attempts)")
        try:
            text = data["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise LLMError(f"{self.url} replied without choices[0].message: {str(data)[:300]}") from None
        usage = data.get("usage") or {}
        reply = Reply(text, self.model, data.get("model"), usage.get("prompt_tokens"),
                      usage.get("completion_tokens"), time.perf_counter() - t0, digest)
        self.budget.spend(reply)
        if self.transcript is not None:
            self.transcript.exchange(messages, params, reply, purpose)
        return reply


class ReplayClient(_Recorded):
    """Answers requests from a recorded transcript (no endpoint). A request that was never
    recorded raises ``LLMError``; ``versions_differ`` says whether the run that recorded it
    had other versions of jax, libtpu or the calibration (its scores may then differ)."""

    def __init__(self, path, model: str | None = None, transcript: Transcript | None = None,
                 budget: Budget | None = None):
        records = read_transcript(path)
        runs = [r for r in records if r.get("type") == "run"]
        self.recorded_versions = runs[0]["versions"] if runs else {}
        self.replies: dict[str, deque] = defaultdict(deque)
        self.scores: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            if r.get("type") == "exchange":
                self.replies[r["hash"]].append(r)
            elif r.get("type") == "score":
                self.scores[r["hash"]].append(r)
        recorded = [r["model"] for r in records if r.get("type") == "exchange" and r.get("model")]
        self.model = model or next(iter(recorded), "default")
        self._models = list(dict.fromkeys([self.model, *recorded]))  # the hashes a request may have
        self.transcript, self.budget = transcript, budget or Budget()
        self._lock = threading.Lock()
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ReplayClient({str(self.path)!r})"

    @property
    def versions_differ(self) -> dict:
        now = versions()
        return {k: (self.recorded_versions.get(k), now.get(k)) for k in now
                if self.recorded_versions.get(k) != now.get(k)}

    def complete(self, messages: list[dict], purpose: str = "code", **params) -> Reply:
        params = {k: v for k, v in params.items() if v is not None}
        digest = None
        with self._lock:
            for model in self._models:
                h = request_hash(model, messages, params)
                if self.replies.get(h):
                    digest, record = h, self.replies[h].popleft()
                    break
            else:
                raise LLMError(f"replay {self.path.name}: no recorded reply for this request "
                               "(the prompt differs from the recorded run's)")
        self.budget.reserve()
        reply = Reply(record["reply"], record.get("model") or self.model, record.get("served_model"),
                      record.get("prompt_tokens"), record.get("completion_tokens"), 0.0, digest, replayed=True)
        self.budget.spend(reply)
        if self.transcript is not None:
            self.transcript.exchange(messages, params, reply, purpose)
        return reply


def replay_check(recorded, replayed) -> dict:
    """Compare the scores of two transcripts, request by request: {"same": n, "differ": [...],
    "missing": [hashes scored in ``recorded`` but not in ``replayed``]}."""
    def scores(path):
        out = defaultdict(list)
        for r in read_transcript(path):
            if r.get("type") == "score":
                out[r["hash"]].append((r.get("correct"), r.get("speedup")))
        return out

    a, b = scores(recorded), scores(replayed)
    same, differ, missing = 0, [], []
    for h, got in a.items():
        if h not in b:
            missing.append(h)
        elif b[h] == got:
            same += 1
        else:
            differ.append({"hash": h, "recorded": got, "replayed": b[h]})
    return {"same": same, "differ": differ, "missing": missing}


def make_client(base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                replay: str | None = None, transcript: str | None = None, max_requests: int | None = None,
                max_total_tokens: int | None = None, **kwargs) -> Any:
    """A ``ChatClient`` (or a ``ReplayClient`` with ``replay``), recording to ``transcript``,
    within ``max_requests`` requests and ``max_total_tokens`` tokens."""
    record = Transcript(transcript) if transcript else None
    budget = Budget(max_requests, max_total_tokens)
    if replay:
        return ReplayClient(replay, model=model, transcript=record, budget=budget)
    return ChatClient(base_url, model, api_key, budget=budget, transcript=record, **kwargs)
