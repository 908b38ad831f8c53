"""LLMPolicy against a real (scripted) OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from action_space.source_edit import edit_block
from policies.llm import LLMPolicy, extract_code

SMALL = {"M": 1024, "K": 1024, "N": 2048}
OLD = 'SCHEDULE = {"block_m": 512,'
NEW = 'SCHEDULE = {"block_m": 256,'
EDIT_REPLY = ("Smaller row blocks first.\n```\nnot this one\n```\nThe edit:\n```python\n"
              + edit_block(OLD, NEW) + "```\n")
BROKEN_REPLY = "Here:\n```python\nimport jax\n\ndef workload(a, b):\n    return undefined_helper(a, b)\n```"


class Scripted:
    """A chat-completions server answering with ``reply``; records every request body."""

    def __init__(self):
        self.reply = ""
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                outer.requests.append({"path": self.path, "body": body})
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                data = json.dumps({
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": outer.reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def server():
    s = Scripted()
    yield s
    s.close()


@pytest.fixture
def policy(server):
    return LLMPolicy(base_url=f"http://127.0.0.1:{server.port}/v1", model="scripted")


def test_extract_code_takes_last_block():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("no code here") == "no code here"


def test_edit_reply_is_applied_and_scored(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="source")
    env.reset(seed=0)
    template = env.source
    server.reply, server.requests[:] = EDIT_REPLY, []
    action = policy.act(env)
    assert "<<<<<<< SEARCH" in action and NEW in action
    _, reward, _, _, info = env.step(action)

    assert len(server.requests) == 1
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "scripted"
    user = [m["content"] for m in req["body"]["messages"] if m["role"] == "user"][0]
    assert template.rstrip() in user

    assert NEW in info["source"] and OLD not in info["source"]
    assert info["schedule"]["block_m"] == 256  # editing the SCHEDULE literal tunes the knob
    assert info["compiled"] and info["correct"], info["error"]
    assert info["speedup"] > 0 and reward == pytest.approx(info["speedup"])
    assert info["speedup"] == pytest.approx(info["baseline_ms"] / info["time_ms"])


def test_broken_kernel_gets_penalty(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="source", penalty=-1.0)
    env.reset(seed=0)
    server.reply = BROKEN_REPLY
    _, reward, _, _, info = env.step(policy.act(env))
    assert reward == -1.0
    assert info["speedup"] is None and not info["correct"]
    assert info["error"] and "undefined_helper" in info["error"]


def test_both_mode_keeps_schedule(make_env, server, policy):
    env = make_env("gemm", SMALL, action_mode="both")
    env.reset(seed=0)
    server.reply = EDIT_REPLY
    action = policy.act(env)
    assert list(action["schedule"]) == list(env.schedule_space.encode(env.schedule))
    assert NEW in action["source"]
