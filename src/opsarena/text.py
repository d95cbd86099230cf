"""Text the arena observed, made safe to store and to show.

A host's file names, process names, unit answers, TLS names and HTTP answers are bytes
its competitor chose; Python hands them over as `str` that may hold lone surrogates (a
non-UTF-8 byte 0xff read with `surrogateescape` becomes U+DCFF), which UTF-8 cannot
encode. Everything here renders such text deterministically and never raises for its
content: a byte that is not UTF-8 shows as `\\xff` (as `backslashreplace` renders
bytes), any other lone surrogate as `\\udXXX`. Valid text is left as it is. Pure.
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    point = ord(match.group())
    if 0xDC80 <= point <= 0xDCFF:  # a byte `surrogateescape` stood in for
        return f"\\x{point - 0xDC00:02x}"
    return f"\\u{point:04x}"


def escape_unencodable(text: str) -> str:
    """`text` with every lone surrogate escaped (`\\xff` for an escaped byte, `\\udXXX`
    otherwise); text UTF-8 can encode comes back unchanged."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_escaped, text)


def storable(value: Any) -> Any:
    """`value` with every string in it, dict keys too, at any depth, passed through
    `escape_unencodable` (tuples become lists, as JSON has them); other values unchanged."""
    if isinstance(value, str):
        return escape_unencodable(value)
    if isinstance(value, dict):
        return {
            (escape_unencodable(k) if isinstance(k, str) else k): storable(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable(item) for item in value]
    return value


def storable_json(value: Any) -> str:
    """`value` as compact JSON text (non-ASCII as itself) that UTF-8 can always encode:
    when any string in it cannot be encoded, the JSON of `storable(value)`. Raises
    `TypeError` only for what JSON cannot represent (never for a string's content)."""
    payload = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        payload.encode()
    except UnicodeEncodeError:
        payload = json.dumps(storable(value), separators=(",", ":"), ensure_ascii=False)
    return payload


def host_text(raw: bytes) -> str:
    """Bytes a host produced (a /proc file, a unit's answer, a header) as text: UTF-8
    where it is, `\\xff` for every byte that is not."""
    return raw.decode("utf-8", errors="backslashreplace")


def host_name(name: str | bytes) -> str:
    """A host's file name (or path) as shown in a verdict, rendered from its bytes: a
    name `os.listdir` decoded with `surrogateescape` shows its odd bytes as `\\xff`,
    exactly as `host_text` shows the same name read as bytes."""
    return host_text(name) if isinstance(name, bytes) else escape_unencodable(name)
