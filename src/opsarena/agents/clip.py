"""Clipping what a competitor sends before it reaches the log: the one function for it.

Every field an agent supplies that the event log keeps (an exec's command, a put's
path, an exec's output, a model's tool-call arguments, ...) passes through `clip`
(the controller applies `clip_all` to every `agent_transcript` entry and `agent_output`
chunk, the gate clips commands and paths tighter): a field of at most `limit` bytes of
UTF-8 is kept as it is; a longer one keeps its first `limit` bytes and says how long the
whole was and its SHA-256, so a reader can still tell which command ran. Bytes that are
not UTF-8 (a command with a `\\xff`, which reaches the arena as a lone surrogate) are
shown as `\\xff` escapes, never passed on as text no JSON encoder can write.
"""

from __future__ import annotations

import hashlib
from typing import Any

CLIP_BYTES = 4096
"""What `clip` keeps of a field by default (bytes of UTF-8)."""


def raw_bytes(text: str | bytes) -> bytes:
    """The bytes `text` stands for: a str that carries undecodable bytes as surrogates
    (`os.fsdecode`, `surrogateescape`) gives them back; any other lone surrogate is
    encoded as it is (`surrogatepass`), which no UTF-8 decoder accepts."""
    if isinstance(text, bytes):
        return text
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def clip(text: str | bytes, limit: int = CLIP_BYTES) -> str:
    """`text` as the log keeps it: itself when it is valid UTF-8 of at most `limit`
    bytes; else its first `limit` bytes (undecodable ones as `\\xNN`), then a line
    `[clipped: N bytes in all, sha256 HEX]` (or `[not UTF-8: ...]` when only the
    escapes changed it)."""
    data = raw_bytes(text)
    if len(data) <= limit:
        try:
            exact = data.decode("utf-8")
        except UnicodeDecodeError:
            return f"{data.decode('utf-8', 'backslashreplace')}\n[not UTF-8: {_summary(data)}]"
        return exact
    cut = limit
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:
        cut -= 1  # not in the middle of a character
    head = data[:cut].decode("utf-8", "backslashreplace")
    return f"{head}\n[clipped: {_summary(data)}]"


def _summary(data: bytes) -> str:
    return f"{len(data)} bytes in all, sha256 {hashlib.sha256(data).hexdigest()}"


def clip_all(value: Any, limit: int = CLIP_BYTES) -> Any:
    """`value` with `clip` applied to every string in it (keys included), through dicts,
    lists and tuples; other values as they are."""
    if isinstance(value, str | bytes):
        return clip(value, limit)
    if isinstance(value, dict):
        return {clip(str(k), limit): clip_all(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clip_all(v, limit) for v in value]
    return value
