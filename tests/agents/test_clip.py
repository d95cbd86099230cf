"""`agents.clip`: the one function every competitor-supplied field passes before the log."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from opsarena.agents.clip import CLIP_BYTES, clip, clip_all


def test_a_short_utf8_field_is_kept_as_it_is() -> None:
    assert clip("systemctl restart records") == "systemctl restart records"
    assert clip("é" * 2048) == "é" * 2048  # exactly 4096 bytes
    assert clip(b"plain bytes") == "plain bytes"


def test_a_long_field_keeps_its_head_with_the_length_and_hash_of_the_whole() -> None:
    command = ": " + "\x01" * 127_000
    clipped = clip(command)
    digest = hashlib.sha256(command.encode()).hexdigest()
    assert clipped == f"{command[:CLIP_BYTES]}\n[clipped: 127002 bytes in all, sha256 {digest}]"
    assert len(json.dumps(clipped)) < 6 * CLIP_BYTES + 200  # \u0001: 6 bytes a byte


def test_a_cut_never_splits_a_character() -> None:
    clipped = clip("a" + "é" * 3000, 10)  # byte 10 is inside the fifth é
    assert clipped.startswith("a" + "é" * 4 + "\n[clipped: 6001 bytes in all")


def test_bytes_that_are_not_utf8_are_shown_escaped_with_the_hash_of_the_exact_bytes() -> None:
    command = b"echo ran > /tmp/\xff".decode(errors="surrogateescape")  # as argv gives it
    clipped = clip(command)
    digest = hashlib.sha256(b"echo ran > /tmp/\xff").hexdigest()
    assert clipped == f"echo ran > /tmp/\\xff\n[not UTF-8: 17 bytes in all, sha256 {digest}]"
    assert clip("\ud800").startswith("\\xed\\xa0\\x80\n[not UTF-8: 3 bytes")  # any lone one


@given(st.text() | st.binary(), st.integers(min_value=1, max_value=64))
def test_what_clip_returns_is_always_writable_utf8_and_bounded(
    value: str | bytes, limit: int
) -> None:
    clipped = clip(value, limit)
    clipped.encode()  # never a lone surrogate: every JSON encoder and store takes it
    head = clipped.split("\n[clipped: ", 1)[0].split("\n[not UTF-8: ", 1)[0]
    assert len(head.encode()) <= 4 * limit  # escapes (\xNN) at most quadruple a byte


def test_clip_all_reaches_every_string_of_an_entry() -> None:
    entry = {"kind": "tool_call", "args": ["x" * 50, {"deep": b"\xff"}], "n": 3, "ok": None}
    clipped = clip_all(entry, 10)
    assert clipped["kind"] == "tool_call" and clipped["n"] == 3 and clipped["ok"] is None
    assert clipped["args"][0].startswith("x" * 10 + "\n[clipped: 50 bytes in all")
    assert clipped["args"][1]["deep"].startswith("\\xff\n[not UTF-8")
