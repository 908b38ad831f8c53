"""A candidate kernel: module source text plus a schedule, identified by content."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Candidate:
    """What one evaluation runs.

    ``source`` defines ``workload(*inputs)``; ``schedule`` is merged over the module's own
    ``SCHEDULE`` dict before the call (ignored by a module without one).
    """

    source: str
    schedule: Mapping[str, Any] = field(default_factory=dict)

    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def key(self) -> dict:
        return {"source": self.source_hash(), "schedule": dict(sorted(self.schedule.items()))}


def content_key(**parts: Any) -> str:
    """A stable hash of JSON-able parts: the evaluation cache's key."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
