"""On-disk, content-addressed cache of evaluation results, safe for concurrent processes.

One JSON file per key under ``<root>/<key[:2]>/<key>.json``, written to a temporary file
and renamed into place, so a reader sees a whole entry or none. Two processes evaluating
the same candidate at once both write the same answer; the last rename wins.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def default_cache_dir() -> Path:
    env = os.environ.get("JAXBENCH_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxbench_gym"


class ResultCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
