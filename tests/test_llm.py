"""The LLM policies against a real (scripted) OpenAI-compatible HTTP server on 127.0.0.1:
transport, prompts, plan-then-code beam search, transcripts and replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from action_space.source_edit import edit_block
from policies.llm import LLMPolicy, NoCode, extract_code
from policies.llm_beam import make_llm_beam
from policies.llm_client import (BudgetExhausted, ChatClient, LLMError, ReplayClient, Transcript,
                                 read_transcript, replay_check)
from policies.llm_prompt import (PROMPT_TOKEN_BUDGET, Attempt, Context, breakdown, code_messages, estimate_tokens,
                                 load_guide, parse_plans, plan_messages, select_sections)
from policies.scripted_server import ScriptedServer, rules_script

SMALL = {"M": 1024, "K": 1024, "N": 2048}
OLD = 'SCHEDULE = {"block_m": 512,'
NEW = 'SCHEDULE = {"block_m": 256,'
EDIT_REPLY = ("Smaller row blocks first.\n```\nnot this one\n```\nThe edit:\n```python\n"
              + edit_block(OLD, NEW) + "```\n")
STALE_EDIT_REPLY = "```python\n" + edit_block("this line is not in the kernel", "x = 1") + "```\n"
BROKEN_REPLY = "Here:\n```python\nimport jax\n\ndef workload(a, b):\n    return undefined_helper(a, b)\n```"
PLANS_REPLY = ("PLAN 1: tiling: 256-row blocks so more grid steps overlap.\n"
               "PLAN 2: grid_order: swap the grid axes.\n"
               "PLAN 3: fusion: fuse the cast into the kernel.\n")


def user_text(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def plan_then_code(body: dict) -> str:
    """Plans on a plan request; per plan: an edit that applies, one that does not, no code."""
    text = user_text(body)
    if "## Task: plan" in text:
        return PLANS_REPLY
    if "256-row blocks" in text:
        return EDIT_REPLY
    if "swap the grid axes" in text:
        return STALE_EDIT_REPLY
    return "I would fuse the cast, but I will not write code today."


@pytest.fixture(scope="module")
def server():
    s = ScriptedServer()
    yield s
    s.close()


@pytest.fixture
def policy(server):
    return LLMPolicy(ChatClient(server.url, "scripted"), plan=False)


# --- replies and plans ------------------------------------------------------------------------

def test_extract_code_takes_last_block_and_says_when_there_is_none():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    bare = edit_block("a = 1", "a = 2")
    assert extract_code("Edits:\n" + bare) == "Edits:\n" + bare
    with pytest.raises(NoCode):
        extract_code("no code here")


def test_plans_are_parsed_or_the_reply_is_one_plan():
    assert parse_plans(PLANS_REPLY, 2) == ["tiling: 256-row blocks so more grid steps overlap.",
                                           "grid_order: swap the grid axes."]
    assert parse_plans("**PLAN 1**: a\nmore\n**PLAN 2**: b", 5) == ["a\nmore", "b"]
    assert parse_plans("just make it faster", 3) == ["just make it faster"]


def test_rules_script_answers_by_the_first_match(server):
    server.script = rules_script([{"when": "## Task: plan", "reply": "PLAN 1: tiling: x"},
                                  {"when": "busy", "status": 503, "reply": "no"},
                                  {"when": ".", "reply": "code"}])
    client = ChatClient(server.url, "scripted", max_retries=0)
    assert client.complete([{"role": "user", "content": "## Task: plan"}]).text == "PLAN 1: tiling: x"
    assert client.complete([{"role": "user", "content": "anything"}]).text == "code"
    with pytest.raises(LLMError, match="HTTP 503"):
        client.complete([{"role": "user", "content": "busy"}])


# --- transport ----------------------------------------------------------------------------------

def test_transport_retries_errors_and_rate_limits_then_succeeds(server):
    answers = iter([(503, "busy", {}), (429, "slow down", {"Retry-After": "0"}), "ok"])
    server.script, server.requests[:] = lambda body: next(answers), []
    client = ChatClient(server.url, "scripted", backoff_s=0.01)
    reply = client.complete([{"role": "user", "content": "hi"}])
    assert reply.text == "ok" and len(server.requests) == 3
    assert reply.prompt_tokens == 100 and client.budget.tokens == 110


def test_transport_gives_up_clearly(server):
    server.script, server.requests[:] = lambda body: (401, "bad key", {}), []
    with pytest.raises(LLMError, match="HTTP 401"):
        ChatClient(server.url, "scripted", backoff_s=0.01).complete([{"role": "user", "content": "hi"}])
    assert len(server.requests) == 1  # not retried
    server.script = lambda body: (500, "down", {})
    with pytest.raises(LLMError, match="gave up after 3 attempts"):
        ChatClient(server.url, "scripted", backoff_s=0.01, max_retries=2).complete([{"role": "user", "content": "x"}])
    with pytest.raises(LLMError, match="cannot reach"):
        ChatClient("http://127.0.0.1:9/v1", "scripted", backoff_s=0.01, max_retries=0).complete([])


def test_budget_stops_requests(server, tmp_path):
    server.reply("fine")
    client = ChatClient(server.url, "scripted")
    client.budget.max_requests = 1
    client.complete([{"role": "user", "content": "one"}])
    with pytest.raises(BudgetExhausted):
        client.complete([{"role": "user", "content": "two"}])


def test_the_key_goes_only_into_the_request_header(server, tmp_path, monkeypatch):
    from jaxbench_env.sandbox import _scrubbed_env

    server.reply("fine")
    server.requests[:] = []
    record = Transcript(tmp_path / "t.jsonl")
    client = ChatClient(server.url, "scripted", api_key="sk-test-secret", transcript=record)
    client.complete([{"role": "user", "content": "hi"}])
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-test-secret"
    assert "sk-test-secret" not in (tmp_path / "t.jsonl").read_text() and "sk-test" not in repr(client)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    assert "sk-test-secret" not in json.dumps(_scrubbed_env(str(tmp_path)))  # a candidate's environment


# --- prompts ----------------------------------------------------------------------------------

GUIDE = load_guide()


def test_the_guide_is_our_own_sections_with_categories_and_error_triggers():
    ids = {s.id for s in GUIDE}
    assert {"tiling_rules", "memory_hierarchy", "attention_patterns", "mosaic_errors"} <= ids
    assert all(s.body.strip() and s.categories for s in GUIDE)
    assert all(len(s.text()) <= 3200 for s in GUIDE)


def test_sections_follow_the_category_and_the_last_error():
    tiling = select_sections(GUIDE, "matmul", "block shape (8, 64) is not divisible by (8, 128) tiling", 6000)
    assert tiling[0].id in ("tiling_rules", "mosaic_errors")
    assert "tiling_rules" in {s.id for s in tiling}
    attention = {s.id for s in select_sections(GUIDE, "attention", None, 20_000)}
    assert "attention_patterns" in attention and "conv_patterns" not in attention
    assert sum(len(s.text()) for s in select_sections(GUIDE, "attention", None, 3000)) <= 3000


def big_context(error=None, attempts=40) -> Context:
    source = (Path(__file__).parents[1] / "workloads" / "templates" / "conv_family.py").read_text()
    history = [Attempt(f"plan {i}: " + "tile differently " * 30, i % 2 == 0, 1.0 + i / 100 if i % 2 == 0 else None,
                       0.5 if i % 2 == 0 else None, None if i % 2 == 0 else "Mosaic failed\n" + "x" * 3000)
               for i in range(attempts)]
    return Context("conv2d", "Workload conv2d ...", "conv", "def reference(x):\n" + "    y = x\n" * 400, source,
                   "kernel pallas_kernel_0: grid (8, 8) ...", history, error)


def test_prompts_carry_history_profile_and_guide_within_the_token_budget():
    ctx = big_context("Mosaic: block shape (8, 64) is not divisible by (8, 128)")
    for messages in (plan_messages(ctx, 3, GUIDE), code_messages(ctx, "tiling: bigger blocks", GUIDE)):
        user = messages[-1]["content"]
        assert estimate_tokens(user) + estimate_tokens(messages[0]["content"]) <= PROMPT_TOKEN_BUDGET
        assert "## Pallas TPU guide" in user and "Tiling" in user or "tiling" in user
        assert "plan 39:" in user and "plan 0:" not in user  # the newest attempts; the oldest cut first
        assert "kernel pallas_kernel_0: grid (8, 8)" in user and ctx.source.rstrip() in user
        assert "not divisible by (8, 128)" in user  # the last error itself
    assert "PLAN 1" in plan_messages(ctx, 3, GUIDE)[-1]["content"]
    assert "<<<<<<< SEARCH" in code_messages(ctx, "x", GUIDE)[-1]["content"]


def test_context_explains_the_score(make_env):
    env = make_env("gemm", SMALL, action_mode="source")
    env.reset(seed=0)
    ctx = Context.of(env)
    assert ctx.category == "matmul" and env.unwrapped.source == ctx.source
    assert "XLA baseline" in ctx.header and "predicted by the v6e simulator" in ctx.header
    assert "kernel matmul_kernel: grid (2, 2, 1) (4 steps)" in ctx.profile and "-bound; VMEM" in ctx.profile
    # the tpu backend's result has the chip, not a simulation: the prompt says what was measured
    measured = breakdown({"device_kind": "TPU v6 lite"}, 128 << 20)
    assert "measured on a TPU v6 lite" in measured and "no per-kernel breakdown" in measured


# --- one kernel per step ------------------------------------------------------------------------

def test_edit_reply_is_applied_and_scored(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="source")
    env.reset(seed=0)
    template = env.source
    server.reply(EDIT_REPLY)
    server.requests[:] = []
    action = policy.act(env)
    assert "<<<<<<< SEARCH" in action and NEW in action
    _, reward, _, _, info = env.step(action)

    assert len(server.requests) == 1
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "scripted"
    assert template.rstrip() in user_text(req["body"])

    assert NEW in info["source"] and OLD not in info["source"]
    assert info["schedule"]["block_m"] == 256  # editing the SCHEDULE literal tunes the knob
    assert info["compiled"] and info["correct"], info["error"]
    assert info["speedup"] > 0 and reward == pytest.approx(info["speedup"])
    policy.act(env)  # the next prompt shows this attempt in the history
    assert "-> correct," in user_text(server.requests[-1]["body"])


def test_broken_kernel_gets_penalty_and_no_code_says_so(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="source", penalty=-1.0)
    env.reset(seed=0)
    server.reply(BROKEN_REPLY)
    _, reward, _, _, info = env.step(policy.act(env))
    assert reward == -1.0
    assert info["speedup"] is None and not info["correct"]
    assert info["error"] and "undefined_helper" in info["error"]
    server.reply("Sorry, no code.")
    policy.act(env)
    assert "no fenced code block" in policy.last_error


def test_both_mode_keeps_schedule(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="both")
    env.reset(seed=0)
    server.reply(EDIT_REPLY)
    action = policy.act(env)
    assert list(action["schedule"]) == list(env.schedule_space.encode(env.schedule))
    assert NEW in action["source"]


# --- plan-then-code beam search, transcript, replay ------------------------------------------------

def run_beam(make_env, client, steps=2):
    from policies import run_policy

    env = make_env("gemm", SMALL, action_mode="source")
    policy = make_llm_beam(client, beam_width=1, n_plans=3, depth=1, concurrency=3)
    records = run_policy(policy, env, steps, seed=0)
    return policy, records


def test_plan_then_code_beam_records_and_replays(make_env, server, tmp_path):
    server.script, server.requests[:] = plan_then_code, []
    recorded = tmp_path / "recorded.jsonl"
    policy, records = run_beam(make_env, ChatClient(server.url, "scripted", transcript=Transcript(recorded)))

    purposes = [("## Task: plan" in user_text(r["body"])) for r in server.requests]
    assert purposes.count(True) == 1 and purposes.count(False) == 3  # one plan request, a code request per plan
    assert records[0]["correct"] and records[0]["schedule"]["block_m"] == 256  # the edit that applied
    failures = policy.proposer.failures
    assert len(failures) == 2 and any("did not apply" in f["error"] or "not found" in f["error"] for f in failures)
    assert any("no fenced code block" in f["error"] for f in failures)
    assert policy.done and records[1]["cached"]  # nothing improved: the best is re-proposed

    log = read_transcript(recorded)
    assert log[0]["type"] == "run" and log[0]["versions"]["jax"]
    exchanges = [r for r in log if r["type"] == "exchange"]
    assert len(exchanges) == 4 and all(r["prompt_tokens"] == 100 and r["latency_s"] >= 0 for r in exchanges)
    scores = [r for r in log if r["type"] == "score"]
    assert len(scores) == 3 and sum(bool(r["correct"]) for r in scores) == 1

    n_requests = len(server.requests)
    replayed = tmp_path / "replayed.jsonl"
    client = ReplayClient(recorded, transcript=Transcript(replayed))
    _, again = run_beam(make_env, client)
    assert len(server.requests) == n_requests  # no endpoint was asked
    assert [r["speedup"] for r in again] == [r["speedup"] for r in records]
    check = replay_check(recorded, replayed)
    assert check == {"same": 3, "differ": [], "missing": []} and client.versions_differ == {}


def test_replay_matches_the_model_asked_for_not_the_one_that_answered(server, tmp_path):
    server.script = lambda body: "fine"
    path = tmp_path / "t.jsonl"
    asked = [{"role": "user", "content": "hi"}]
    ChatClient(server.url, "alias", transcript=Transcript(path)).complete(asked)
    lines = (tmp_path / "t.jsonl").read_text()
    (tmp_path / "t.jsonl").write_text(lines.replace('"served_model": "alias"', '"served_model": "alias-2026-01"'))
    reply = ReplayClient(path).complete(asked)
    assert reply.text == "fine" and reply.served_model == "alias-2026-01" and reply.model == "alias"


def test_replay_of_an_unrecorded_request_fails_clearly(tmp_path):
    path = tmp_path / "empty.jsonl"
    Transcript(path)
    with pytest.raises(LLMError, match="no recorded reply"):
        ReplayClient(path).complete([{"role": "user", "content": "never asked"}])


@pytest.mark.slow
def test_cli_llm_beam_records_then_replays(server, cache_dir, tmp_path):
    server.script = plan_then_code
    env = dict(os.environ, JAXBENCH_CACHE_DIR=str(cache_dir))
    env.pop("OPENAI_API_KEY", None)
    base = [sys.executable, "-m", "jaxbench_env", "optimize", "gemm", "--config", "M=1024,K=1024,N=2048",
            "--policy", "llm-beam", "--beam-width", "1", "--plans", "3", "--steps", "2", "--json"]
    first = subprocess.run(base + ["--base-url", server.url, "--model", "scripted", "--out", str(tmp_path / "a")],
                           capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    transcript = tmp_path / "a" / "transcript.jsonl"
    second = subprocess.run(base + ["--replay", str(transcript), "--out", str(tmp_path / "b")],
                            capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0, second.stderr[-2000:]
    scored = sum(r["type"] == "score" for r in read_transcript(transcript))
    assert scored >= 3 and f"{scored} scores as recorded, 0 different" in second.stderr
    log = json.loads((tmp_path / "b" / "log.json").read_text())
    assert log["replay"]["same"] == scored and log["transcript"].endswith("transcript.jsonl")
    assert json.loads(first.stdout)["best_speedup"] == json.loads(second.stdout)["best_speedup"]
