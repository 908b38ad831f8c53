"""A scripted OpenAI-compatible chat server: try the LLM policies without a model.

It answers ``POST .../chat/completions`` from a script: the first rule whose ``when`` regex
matches the last user message gives the reply (``status`` other than 200 answers with that
HTTP error instead). Every request is kept in ``requests`` (path, headers, body).

    python -m policies.scripted_server --script rules.json [--port 8765]

``rules.json`` is a list of ``{"when": "regex", "reply": "text", "status": 200}``; a request no
rule matches gets an empty reply. From Python (the tests do this), ``script`` may instead be
any ``body -> reply`` callable, the reply a string or ``(status, text, headers)``.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def chat_response(text: str, model: str | None) -> dict:
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": model or "scripted",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}


def last_user_message(body: dict) -> str:
    return next((m.get("content") or "" for m in reversed(body.get("messages") or []) if m.get("role") == "user"), "")


def rules_script(rules: list[dict]):
    """A script from ``{"when", "reply", "status"}`` rules: the first match answers."""
    compiled = [(re.compile(r.get("when", ""), re.DOTALL), r) for r in rules]

    def script(body):
        text = last_user_message(body)
        for pattern, rule in compiled:
            if pattern.search(text):
                status = int(rule.get("status", 200))
                return rule.get("reply", "") if status == 200 else (status, rule.get("reply", ""), {})
        return ""

    return script


class ScriptedServer:
    """The server, on 127.0.0.1 in a background thread; ``url`` ends in ``/v1``."""

    def __init__(self, script=None, port: int = 0):
        self.script = script or (lambda body: "")
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                except json.JSONDecodeError:
                    self.send_error(400, "body is not JSON")
                    return
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                out, status, headers = outer.script(body), 200, {}
                if isinstance(out, tuple):
                    status, out, headers = out
                data = (json.dumps(chat_response(out, body.get("model"))) if status == 200 else out).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reply(self, text: str) -> None:
        """Answer every request with ``text``."""
        self.script = lambda body: text

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="A scripted OpenAI-compatible chat server.")
    ap.add_argument("--script", required=True, help="JSON list of {when, reply, status} rules")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args(argv)
    server = ScriptedServer(rules_script(json.loads(Path(args.script).read_text())), args.port)
    print(f"serving {args.script} at {server.url}", flush=True)
    try:
        server._thread.join()
    except KeyboardInterrupt:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
