"""The hash chain over a match's events: the exact hash input, and the pure checks on it.

Each event's `hash` is the SHA-256 (lowercase hex) of the canonical JSON of the object

    {"data": DATA, "match_id": M, "prev_hash": P, "seq": N, "t_ms": T, "type": TYPE,
     "wall": W}

where `prev_hash` is the `hash` of the match's event `N - 1` (64 zeros, `GENESIS`, for
`seq` 1). Canonical JSON here is Python's `json.dumps(obj, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)` encoded as UTF-8: keys sorted at every level,
no whitespace, non-ASCII characters as themselves. Anyone can recompute it from
`opsarena events MATCH --json` (each line carries `prev_hash` and `hash`).

The chain shows any edit, insertion, deletion or reordering made without recomputing every
later hash. It holds no secret: someone able to write the database and recompute every
hash from the edit onwards is stopped only by the file's permissions (docs/SECURITY.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opsarena.text import storable, storable_json

GENESIS = "0" * 64
"""The `prev_hash` of a match's first event."""


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes (sorted keys, no whitespace, UTF-8). A string UTF-8
    cannot encode is escaped first, as the stores keep it (`opsarena.text.storable`)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        value = storable(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def event_hash(
    match_id: str,
    seq: int,
    event_type: str,
    t_ms: int,
    wall: str,
    data: Mapping[str, Any],
    prev_hash: str,
) -> str:
    """The chain hash of one event (see the module docstring for the exact input)."""
    envelope = {
        "data": dict(data),
        "match_id": match_id,
        "prev_hash": prev_hash,
        "seq": seq,
        "t_ms": t_ms,
        "type": event_type,
        "wall": wall,
    }
    return hashlib.sha256(canonical_json(envelope)).hexdigest()


def content_digest(event_type: str, t_ms: int, data: Mapping[str, Any]) -> str:
    """SHA-256 of what an appender wrote (type, t_ms, data), as the store will read it
    back (`data` through one JSON round trip, escaped as `encode_event_data` escapes it):
    independent of seq and chain, so a writer can later check its own events even if
    someone redid every hash after an edit."""
    stored = json.loads(storable_json(dict(data)))
    return hashlib.sha256(canonical_json([event_type, t_ms, stored])).hexdigest()


@dataclass(frozen=True)
class ChainLink:
    """What the chain checks of one stored row (its content and its two hash columns)."""

    match_id: str
    seq: int
    type: str
    t_ms: int
    wall: str
    data: Mapping[str, Any]
    prev_hash: str
    hash: str

    def computed_hash(self) -> str:
        return event_hash(
            self.match_id, self.seq, self.type, self.t_ms, self.wall, self.data, self.prev_hash
        )

    def hash_ok(self) -> bool:
        """Whether the row's content hashes to its stored `hash`."""
        return self.hash == self.computed_hash()


@dataclass(frozen=True)
class ChainProblem:
    """One place where a match's log breaks: `seq` and one line saying what is wrong."""

    seq: int
    what: str


def chain_problems(
    links: Iterable[ChainLink], *, last_seq: int | None = None
) -> list[ChainProblem]:
    """Every break in a match's chain, in `seq` order (empty: the chain is intact).

    `links` are the match's rows in `seq` order. `last_seq` is the store's own count of
    the events it appended; a row above it was never appended through the store.
    """
    problems: list[ChainProblem] = []
    expected_seq = 1
    prev_hash = GENESIS
    for link in links:
        if link.seq != expected_seq:
            if link.seq > expected_seq:
                missing = (
                    f"seq {expected_seq}"
                    if link.seq == expected_seq + 1
                    else f"seqs {expected_seq}-{link.seq - 1}"
                )
                problems.append(ChainProblem(expected_seq, f"{missing} missing"))
            else:
                problems.append(ChainProblem(link.seq, f"seq {link.seq} is out of order"))
        if last_seq is not None and link.seq > last_seq:
            problems.append(
                ChainProblem(
                    link.seq,
                    f"a {link.type} row the store never appended (its last appended seq is "
                    f"{last_seq})",
                )
            )
        elif not link.hash:
            problems.append(ChainProblem(link.seq, f"the {link.type} row has no hash"))
        elif not link.hash_ok():
            problems.append(
                ChainProblem(link.seq, f"the {link.type} row does not match its hash (edited)")
            )
        elif link.prev_hash != prev_hash:
            problems.append(
                ChainProblem(
                    link.seq,
                    f"the {link.type} row does not chain to seq {link.seq - 1} "
                    "(prev_hash differs: an event was inserted, removed or rewritten before it)",
                )
            )
        prev_hash = link.hash
        expected_seq = link.seq + 1
    if last_seq is not None and expected_seq <= last_seq:
        problems.append(
            ChainProblem(expected_seq, f"seqs {expected_seq}-{last_seq} missing (deleted)")
        )
    return problems


def forged_tail_start(links: list[ChainLink], last_seq: int) -> int | None:
    """Where a forged tail of a match's rows begins, or `None` when its head is sound.

    The tail is every row above `last_seq` (the store never appended them), plus the
    rows just below that do not hash to their own `hash` or do not chain to the row before
    them, walking back from the top while they fail. A broken row below a sound one is
    not part of the tail: it stays in place for `chain_problems` to report.
    """
    by_seq = {link.seq: link for link in links}
    start = last_seq + 1
    foreign = any(link.seq > last_seq for link in links)
    while start > 1:
        link = by_seq.get(start - 1)
        if link is not None and link.hash and link.hash_ok():
            before = by_seq.get(start - 2)
            expected_prev = GENESIS if start - 1 == 1 else (before.hash if before else None)
            if link.prev_hash == expected_prev:
                break
        start -= 1
    if start == last_seq + 1 and not foreign:
        return None
    return start
