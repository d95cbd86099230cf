"""What the arena reads from a host's bus is the host's choice: a reply it cannot parse
is the host's `BusError`, never a parser's exception escaping into a check or a fault."""

from __future__ import annotations

import pytest
from jeepney import (  # type: ignore[import-untyped]
    DBusAddress,
    Parser,
    new_method_call,
    new_method_return,
)

from opsarena.hosts.systemd_bus import MANAGER_PATH, SYSTEMD, BusError, buffered_messages


def reply(text: bytes) -> bytes:
    """A reply to LoadUnit whose string is `text`, as bytes on the wire."""
    call = new_method_call(
        DBusAddress(MANAGER_PATH, SYSTEMD, "org.freedesktop.systemd1.Manager"), "LoadUnit"
    )
    call.header.serial = 1
    marker = "Q" * len(text)
    wire = new_method_return(call, "s", (marker,)).serialise(serial=2)
    return wire.replace(marker.encode(), text)


def test_a_reply_that_is_not_utf8_is_a_bus_error() -> None:
    parser = Parser()
    parser.add_data(reply(b"/org/freedesktop/systemd1/unit/\xff\xfe"))
    with pytest.raises(BusError, match="cannot read: UnicodeDecodeError"):
        list(buffered_messages(parser))


def test_a_reply_that_is_text_is_read() -> None:
    parser = Parser()
    parser.add_data(reply(b"/org/freedesktop/systemd1/unit/app_2eservice") + reply(b"x"))
    bodies = [m.body for m in buffered_messages(parser)]
    assert bodies == [("/org/freedesktop/systemd1/unit/app_2eservice",), ("x",)]
