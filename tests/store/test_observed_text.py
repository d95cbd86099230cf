"""The event boundary takes any text the arena observed: escaped the same way every time,
never refused for its content (`opsarena.text`, `encode_event_data`)."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from opsarena.store import MAX_EVENT_BYTES, canonical_json, content_digest, encode_event_data
from opsarena.text import escape_unencodable, host_name, host_text, storable

# Any code point, lone surrogates included (what os.fsdecode, a JSON body or a bug makes).
ANY_TEXT = st.text(alphabet=st.characters(codec=None, categories=None))
DATA: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(ANY_TEXT, DATA, max_size=5))
def test_any_text_encodes_and_round_trips_deterministically(data: dict[str, Any]) -> None:
    payload = encode_event_data("attempt_result", data)
    raw = payload.encode()  # UTF-8 can always hold it
    assert len(raw) <= MAX_EVENT_BYTES
    assert encode_event_data("attempt_result", data) == payload  # the same every time
    stored = json.loads(payload)
    assert stored == storable(data)
    # What was stored is stored again unchanged, and hashes as the raw data hashes.
    assert encode_event_data("attempt_result", stored) == payload
    assert canonical_json(stored) == canonical_json(data)
    assert content_digest("x", 1, data) == content_digest("x", 1, stored)


@given(text=ANY_TEXT)
def test_valid_text_is_left_alone_and_only_surrogates_change(text: str) -> None:
    escaped = escape_unencodable(text)
    escaped.encode()
    try:
        text.encode()
    except UnicodeEncodeError:
        assert escaped != text
    else:
        assert escaped == text


@given(raw=st.binary(max_size=64))
def test_a_host_name_shows_the_same_read_as_bytes_or_as_surrogateescaped_text(
    raw: bytes,
) -> None:
    shown = host_text(raw)
    shown.encode()
    assert host_name(os.fsdecode(raw)) == shown == host_name(raw)
    try:
        assert shown == raw.decode()  # a name that is UTF-8 shows as itself
    except UnicodeDecodeError:
        assert "\\x" in shown  # else its odd bytes show as \xNN


def test_the_escapes_are_the_documented_ones() -> None:
    assert host_name(os.fsdecode(b"/opt/plant/\xff")) == "/opt/plant/\\xff"
    assert escape_unencodable("a\ud800b\udcffc\U0001f600") == "a\\ud800b\\xffc\U0001f600"
    assert json.loads(encode_event_data("x", {"\udcfe": ["\udcff", ("t",)]})) == {
        "\\xfe": ["\\xff", ["t"]]
    }
