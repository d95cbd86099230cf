"""The hash chain: its exact input, and the pure checks `verify` and the store rely on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from opsarena.store import (
    GENESIS,
    ChainLink,
    chain_problems,
    event_hash,
    forged_tail_start,
)


def chained(n: int, match_id: str = "m") -> list[ChainLink]:
    links: list[ChainLink] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        data = {"i": seq, "text": "é<script>"}
        digest = event_hash(match_id, seq, "agent_output", seq * 10, "w", data, prev)
        links.append(ChainLink(match_id, seq, "agent_output", seq * 10, "w", data, prev, digest))
        prev = digest
    return links


def test_the_hash_input_is_the_documented_canonical_json() -> None:
    data = {"b": [1, {"z": 2, "a": "ü"}], "a": 1.5}
    # Written out by hand: keys sorted at every level, no spaces, UTF-8, not \u-escaped.
    text = (
        '{"data":{"a":1.5,"b":[1,{"a":"ü","z":2}]},"match_id":"m1","prev_hash":"'
        + GENESIS
        + '","seq":1,"t_ms":-5,"type":"match_created","wall":"2026-01-01T00:00:00.000Z"}'
    )
    expected = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert event_hash("m1", 1, "match_created", -5, "2026-01-01T00:00:00.000Z", data, GENESIS) == (
        expected
    )
    assert json.loads(text)["data"] == data


def test_an_intact_chain_has_no_problem_and_every_change_is_found_at_its_seq() -> None:
    links = chained(6)
    assert chain_problems(links, last_seq=6) == []

    edited = list(links)
    edited[3] = replace(links[3], data={"i": 4, "text": "changed"})
    problems = chain_problems(edited, last_seq=6)
    assert [p.seq for p in problems] == [4] and "does not match its hash" in problems[0].what

    # Re-hashing the edited row moves the break to the next one: it no longer chains.
    rehashed = list(edited)
    rehashed[3] = replace(edited[3], hash=edited[3].computed_hash())
    problems = chain_problems(rehashed, last_seq=6)
    assert [p.seq for p in problems] == [5] and "does not chain" in problems[0].what

    deleted = links[:2] + links[3:]
    assert chain_problems(deleted, last_seq=6)[0].seq == 3
    assert "missing" in chain_problems(deleted, last_seq=6)[0].what

    cut = links[:4]
    problems = chain_problems(cut, last_seq=6)
    assert [p.seq for p in problems] == [5] and "deleted" in problems[0].what

    beyond = chained(8)
    problems = chain_problems(beyond, last_seq=6)
    assert [p.seq for p in problems] == [7, 8]
    assert all("never appended" in p.what for p in problems)

    hashless = list(links)
    hashless[0] = replace(links[0], hash="")
    assert chain_problems(hashless)[0].what.endswith("has no hash")


def test_the_forged_tail_is_the_rows_above_last_seq_and_the_bad_rows_just_below() -> None:
    links = chained(10)
    assert forged_tail_start(links, 10) is None
    assert forged_tail_start(links, 7) == 8  # rows 8-10 were never appended
    bad_head = [*links[:8], replace(links[8], hash="0" * 64), replace(links[9], hash="")]
    assert forged_tail_start(bad_head, 10) == 9
    # A bad row below a sound one is not a tail: it stays for `chain_problems`.
    deep = list(links)
    deep[2] = replace(links[2], data={"edited": True})
    assert forged_tail_start(deep, 10) is None
    assert forged_tail_start([], 0) is None
