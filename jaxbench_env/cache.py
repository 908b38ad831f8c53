"""On-disk, content-addressed cache of evaluation results, safe for concurrent processes.

One JSON file per key under ``<root>/<key[:2]>/<key>.json``, written to a temporary file
and renamed into place, so a reader sees a whole entry or none. Two processes evaluating
the same candidate at once both write the same answer; the last rename wins.

Every entry is authenticated: it holds an HMAC-SHA256 of its key and value under a secret
that only the judge's side reads, so an entry written by anything else (a candidate that
reached the directory, a stale or hand-edited file) is a miss, never a result. The secret
is ``JAXBENCH_CACHE_SECRET`` (hex) if set, else ``<root>/.secret``, created once with mode
0600: nodes that share a cache directory share its secret with it; the sandbox hides the
directory from candidates altogether.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path

SECRET_ENV = "JAXBENCH_CACHE_SECRET"
SECRET_FILE = ".secret"


def default_cache_dir() -> Path:
    env = os.environ.get("JAXBENCH_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxbench_gym"


def _temp_beside(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to a temporary file beside ``path``; returns it (the caller renames or links)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename: a reader sees the old file or the new one."""
    tmp = _temp_beside(path, text, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_secret(root: Path) -> bytes:
    """The cache's HMAC secret: from the environment, or the root's secret file (made once)."""
    env = os.environ.get(SECRET_ENV)
    if env:
        return bytes.fromhex(env)
    path = root / SECRET_FILE
    root.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = _temp_beside(path, secrets.token_hex(32), 0o600)
        try:
            os.link(tmp, path)  # fails if another process made it first: theirs wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return bytes.fromhex(path.read_text().strip())


class ResultCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self._secret: bytes | None = None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _mac(self, key: str, blob: str) -> str:
        if self._secret is None:
            self._secret = load_secret(self.root)
        return hmac.new(self._secret, f"{key}\n{blob}".encode(), hashlib.sha256).hexdigest()

    def get(self, key: str) -> dict | None:
        try:
            entry = json.loads(self._path(key).read_text())
            blob, mac = entry["value"], entry["mac"]
            if not (isinstance(blob, str) and isinstance(mac, str) and hmac.compare_digest(mac, self._mac(key, blob))):
                return None
            value = json.loads(blob)
        except (OSError, ValueError, TypeError, KeyError):
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = json.dumps(value)
        write_atomic(path, json.dumps({"value": blob, "mac": self._mac(key, blob)}))
