"""A small reader of server-sent events over httpx, for the tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Message:
    event: str
    id: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def messages(response: httpx.Response) -> Iterator[Message]:
    """The messages of an open `text/event-stream` response, as they arrive (comments,
    such as keep-alive pings, are skipped)."""
    event, ident, data = "message", None, list[str]()
    for line in response.iter_lines():
        if not line:
            if data:
                yield Message(event, ident, "\n".join(data))
            event, ident, data = "message", None, list[str]()
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "id":
                ident = value
            elif field == "data":
                data.append(value)
