"""Keeping a conversation inside the model's context window: estimates, cuts, shedding.

Tool output is cut to its head and tail with a marker (the error at the end of an apt or
journalctl log matters most). Before a request would pass the window, old tool outputs
and the contents of old `write_file` calls are replaced by a note, oldest first; if that
is not enough, whole old turns are dropped, and last the bulk of recent turns too. The
system prompt, the first user message and the newest message are always kept whole.
Pure functions; they edit the list they are given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

DEFAULT_CHARS_PER_TOKEN = 3.0
"""A conservative guess until the provider's token counts calibrate it."""
KEEP_RECENT_TURNS = 2
"""Assistant turns (with their tool results) never shed."""


def head_tail(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters: its head and its (longer) tail, with a
    marker in between saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut from the middle ...]\n{text[-tail:]}"


def message_chars(messages: list[dict[str, Any]]) -> int:
    """The size of `messages` as sent, in characters of JSON."""
    return len(json.dumps(messages, ensure_ascii=False))


def estimate_tokens(messages: list[dict[str, Any]], chars_per_token: float) -> int:
    """Tokens `messages` take, estimated from their JSON size."""
    return int(message_chars(messages) / chars_per_token) + 1


def _turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


SHED_NOTE = "[removed to fit the context window: {what}; run it again if you need it]"
DROPPED_NOTE = "[{n} earlier turns were removed to fit the context window]"


def _shed_one(message: dict[str, Any]) -> bool:
    """Replace the bulky part of one message by a note. True if anything changed."""
    if message.get("role") == "tool":
        content = message.get("content")
        if isinstance(content, str) and not content.startswith("[removed to fit"):
            what = f"the output of this call ({len(content)} characters)"
            message["content"] = SHED_NOTE.format(what=what)
            return True
        return False
    changed = False
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if function.get("name") != "write_file":
            continue
        try:
            args = json.loads(function.get("arguments") or "")
        except json.JSONDecodeError:
            continue
        content = args.get("content") if isinstance(args, dict) else None
        if isinstance(content, str) and not content.startswith("[removed to fit"):
            args["content"] = SHED_NOTE.format(what=f"{len(content)} characters written")
            function["arguments"] = json.dumps(args)
            changed = True
    return changed


def fit(
    messages: list[dict[str, Any]],
    budget: int,
    estimate: Callable[[list[dict[str, Any]]], int],
) -> tuple[int, int]:
    """Shed old content from `messages` (in place) until `estimate(messages) <= budget`
    or nothing more may go. Returns (messages shed, turns dropped)."""
    shed = dropped = 0
    if estimate(messages) <= budget:
        return 0, 0
    starts = _turn_starts(messages)
    protected_from = starts[-KEEP_RECENT_TURNS] if len(starts) >= KEEP_RECENT_TURNS else 0
    for index in range(2, protected_from):
        if _shed_one(messages[index]):
            shed += 1
            if estimate(messages) <= budget:
                return shed, dropped
    while estimate(messages) > budget:
        starts = [i for i in _turn_starts(messages) if i >= 2]
        if len(starts) <= KEEP_RECENT_TURNS:
            break
        first, following = starts[0], starts[1]
        del messages[first:following]
        dropped += 1
        note = messages[2] if len(messages) > 2 else None
        if note is not None and note.get("role") == "user" and note.get("_dropped"):
            note["_dropped"] += 1
            note["content"] = DROPPED_NOTE.format(n=note["_dropped"])
        else:
            messages.insert(2, {"role": "user", "content": DROPPED_NOTE.format(n=1), "_dropped": 1})
    for index in range(2, len(messages) - 1):  # last resort: all but the newest message
        if estimate(messages) <= budget:
            break
        if _shed_one(messages[index]):
            shed += 1
    return shed, dropped


def wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as sent: without the keys only the agent uses (those starting `_`)."""
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in messages]
