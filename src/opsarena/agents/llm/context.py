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
"""The note that replaces dropped turns; a digest of what they ran follows it."""


DIGEST_LINES = 30
"""Lines of the dropped turns' digest kept in the note."""


def _first_line(text: Any, limit: int = 100) -> str:
    line = str(text or "").strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[:limit] + "..."


def digest(turns: list[dict[str, Any]]) -> list[str]:
    """One line per tool call (and referee message) of `turns`: what was run, how it went.
    What the model keeps of turns dropped to fit the window."""
    results = {m.get("tool_call_id"): m.get("content") for m in turns if m.get("role") == "tool"}
    lines = []
    for message in turns:
        if message.get("role") == "user" and str(message.get("content", "")).startswith("Referee:"):
            lines.append(f"- {_first_line(message['content'], 160)}")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            try:
                args = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {}
            what = args.get("command") or args.get("path") if isinstance(args, dict) else None
            outcome = results.get(call.get("id"))
            if isinstance(outcome, str) and outcome.startswith("[removed to fit"):
                outcome = None
            head = f"- {function.get('name')} {_first_line(what, 80)}".rstrip()
            lines.append(f"{head} -> {_first_line(outcome, 80)}" if outcome else head)
    return lines


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
        lines = digest(messages[first:following])
        del messages[first:following]
        dropped += 1
        note = messages[2] if len(messages) > 2 else None
        if note is None or note.get("role") != "user" or not note.get("_dropped"):
            note = {"role": "user", "content": "", "_dropped": 0, "_ran": []}
            messages.insert(2, note)
        note["_dropped"] += 1
        note["_ran"] = (note["_ran"] + lines)[-DIGEST_LINES:]
        note["content"] = DROPPED_NOTE.format(n=note["_dropped"]) + (
            "\nWhat they did, oldest first:\n" + "\n".join(note["_ran"]) if note["_ran"] else ""
        )
    for index in range(2, len(messages) - 1):  # last resort: all but the newest message
        if estimate(messages) <= budget:
            break
        if _shed_one(messages[index]):
            shed += 1
    return shed, dropped


def wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as sent: without the keys only the agent uses (those starting `_`)."""
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in messages]
