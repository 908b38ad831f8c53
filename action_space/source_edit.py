"""Source actions: a whole module, or search/replace edit blocks against the current source.

An edit block looks like::

    <<<<<<< SEARCH
    block_m = 128
    =======
    block_m = 256
    >>>>>>> REPLACE

Text with at least one such block is applied block by block (each SEARCH text must occur
in the source exactly once); any other text replaces the module whole.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Mapping

MAX_SOURCE_CHARS = 100_000

_BLOCK = re.compile(
    r"<<<<<<< SEARCH\n(?P<search>.*?)\n?=======\n(?P<replace>.*?)\n?>>>>>>> REPLACE", re.DOTALL
)


class EditError(ValueError):
    """The action text cannot be turned into a source: the message says why."""


def apply_source_action(current: str, text: str) -> str:
    """The new module source that ``text`` describes, given the ``current`` source."""
    if not isinstance(text, str):
        raise EditError(f"source action must be a string, got {type(text).__name__}")
    if not text.strip():
        raise EditError("source action is empty")
    if len(text) > MAX_SOURCE_CHARS:
        raise EditError(f"source action is {len(text)} characters, over the limit of {MAX_SOURCE_CHARS}")
    blocks = list(_BLOCK.finditer(text))
    if not blocks:
        if "<<<<<<< SEARCH" in text:
            raise EditError("malformed edit block: expected SEARCH, =======, REPLACE markers on their own lines")
        return text
    source = current
    for n, block in enumerate(blocks, 1):
        search, replace = block.group("search"), block.group("replace")
        count = source.count(search) if search else 0
        if count != 1:
            what = "is empty" if not search else ("was not found" if count == 0 else f"occurs {count} times")
            raise EditError(f"edit block {n}: SEARCH text {what} in the current source")
        source = source.replace(search, replace, 1)
    return source


def edit_block(search: str, replace: str) -> str:
    """Format one search/replace block (for policies that write edits)."""
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


_SCHEDULE_LITERAL = re.compile(r"^SCHEDULE\s*(?::[^=\n]*)?=\s*\{[^{}]*\}", re.MULTILINE)


def read_schedule(source: str) -> dict | None:
    """The module's top-level ``SCHEDULE = {...}`` literal, or None if it has none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "SCHEDULE" and getattr(node, "value", None) is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def with_schedule(source: str, schedule: Mapping[str, Any]) -> str:
    """``source`` with its top-level ``SCHEDULE = {...}`` literal set to ``schedule``
    (or, if there is no such literal, with a comment naming the schedule)."""
    body = ", ".join(f"{json.dumps(k)}: {json.dumps(v) if isinstance(v, str) else repr(v)}" for k, v in schedule.items())
    literal = "SCHEDULE = {" + body + "}"
    if schedule and _SCHEDULE_LITERAL.search(source):
        return _SCHEDULE_LITERAL.sub(lambda m: literal, source, count=1)
    if not schedule:
        return source
    return f"# Best schedule (no SCHEDULE literal found to rewrite): {literal}\n" + source
