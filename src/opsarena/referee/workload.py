"""The write-read workload: which records one attempt writes and reads, derived from the seed.

Every id and value is derived by HMAC-SHA256 keyed by the match seed from a `Slot` (the
territory, milestone, attempt and the slot's name), so a replay writes the same bytes and
nobody without the seed can predict them. Values are regenerated from their slot, never
stored: the ledger keeps only hashes. All of it is pure.

One attempt's plan (`plan_attempt`), in the order the check runs it:

| step          | what                                                                  |
|---------------|-----------------------------------------------------------------------|
| text          | PUT + GET of `opaque-<32 hex>` under `record-<16 hex>` (the seed's shape) |
| binary        | PUT + GET of all 256 byte values in a seeded order (NUL, CR, LF, invalid UTF-8) |
| empty         | PUT + GET of an empty value (200 with an empty body)                  |
| large         | PUT + GET of a 1 MiB binary value                                     |
| overwrite     | PUT v1, GET v1, PUT v2 under the same id, GET must be v2              |
| parallel      | 8 PUTs to distinct ids at once, then 8 GETs at once, each its own value |
| same-id       | 4 PUTs of different values to one id at once; GET is one of the four |
| unwritten     | GET of an id never written must be 404                                |
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from opsarena.referee.records import derive_record

LARGE_BYTES = 1024 * 1024
"""The brief promises values "up to at least 1 MiB"."""
PARALLEL_DISTINCT = 8
PARALLEL_SAME_ID = 4
PARALLEL_VALUE_BYTES = 512
UNWRITTEN_PROBES = 1
"""Never-written ids probed by each write-read attempt (the ledger probes more after faults)."""


@dataclass(frozen=True)
class Slot:
    """Where one value comes from: enough to regenerate its id and bytes from the seed."""

    territory: str
    milestone: str
    attempt: int
    name: str

    def label(self) -> list[str | int]:
        return ["opsarena-slot", self.territory, self.milestone, self.attempt, self.name]


def _key(seed: bytes, parts: list[str | int]) -> bytes:
    if not seed:
        raise ValueError("the match seed must not be empty")
    return hmac.new(seed, json.dumps(parts).encode(), hashlib.sha256).digest()


def slot_id(seed: bytes, slot: Slot) -> str:
    """`record-<16 hex>` for `slot` (the text slot keeps `derive_record`'s id)."""
    if slot.name == "text":
        return derive_record(seed, slot.territory, slot.milestone, slot.attempt)[0]
    return f"record-{_key(seed, [*slot.label(), 'id'])[:8].hex()}"


def slot_kind(name: str) -> str:
    """The kind of value a slot's name asks for: the part before any `@` (`binary@2` is a
    second round's binary value)."""
    return name.split("@", 1)[0]


def slot_value(seed: bytes, slot: Slot) -> bytes:
    """The bytes of `slot`'s value; the kind of value follows from the slot's name
    (`slot_kind`): text, binary, empty, large, else 512 random bytes."""
    name = slot_kind(slot.name)
    if name == "text":
        return derive_record(seed, slot.territory, slot.milestone, slot.attempt)[1].encode()
    key = _key(seed, [*slot.label(), "value"])
    if name == "binary":
        return bytes(sorted(range(256), key=lambda b: hmac.new(key, bytes([b]), "sha256").digest()))
    if name == "empty":
        return b""
    if name == "large":
        return hashlib.shake_256(key).digest(LARGE_BYTES)
    return hashlib.shake_256(key).digest(PARALLEL_VALUE_BYTES)


def unwritten_id(seed: bytes, territory: str, milestone: str, attempt: int, index: int) -> str:
    """An id the referee never writes (derived under a label no written slot uses)."""
    key = _key(seed, ["opsarena-unwritten", territory, milestone, attempt, index])
    return f"record-{key[:8].hex()}"


@dataclass(frozen=True)
class Record:
    """One record to write: its slot, id and value (bytes held only during the attempt)."""

    slot: Slot
    id: str
    value: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.value).hexdigest()


@dataclass(frozen=True)
class AttemptPlan:
    """Every record of one write-read attempt (see the module docstring)."""

    text: Record
    binary: Record
    empty: Record
    large: Record
    overwrite: tuple[Record, Record]
    parallel: tuple[Record, ...]
    same_id: tuple[Record, ...]
    unwritten: tuple[str, ...]

    def written(self) -> list[Record]:
        return [
            self.text,
            self.binary,
            self.empty,
            self.large,
            *self.overwrite,
            *self.parallel,
            *self.same_id,
        ]


def make_record(seed: bytes, slot: Slot, *, id_of: Slot | None = None) -> Record:
    """The record of `slot`, stored under `id_of`'s id when given (overwrites, same-id)."""
    return Record(slot, slot_id(seed, id_of or slot), slot_value(seed, slot))


def plan_attempt(seed: bytes, territory: str, milestone: str, attempt: int) -> AttemptPlan:
    """The whole plan of one write-read attempt. Pure."""

    def slot(name: str) -> Slot:
        return Slot(territory, milestone, attempt, name)

    first = slot("overwrite-1")
    same = slot("same-id-0")
    return AttemptPlan(
        text=make_record(seed, slot("text")),
        binary=make_record(seed, slot("binary")),
        empty=make_record(seed, slot("empty")),
        large=make_record(seed, slot("large")),
        overwrite=(make_record(seed, first), make_record(seed, slot("overwrite-2"), id_of=first)),
        parallel=tuple(make_record(seed, slot(f"parallel-{i}")) for i in range(PARALLEL_DISTINCT)),
        same_id=tuple(
            make_record(seed, slot(f"same-id-{i}"), id_of=same) for i in range(PARALLEL_SAME_ID)
        ),
        unwritten=tuple(
            unwritten_id(seed, territory, milestone, attempt, i) for i in range(UNWRITTEN_PROBES)
        ),
    )


def regenerate(seed: bytes, slot: Slot) -> bytes:
    """The value of a ledger entry's slot, regenerated (the ledger never keeps bytes)."""
    return slot_value(seed, slot)


def first_difference(expected: bytes, received: bytes) -> int | None:
    """The offset of the first byte where `received` differs from `expected` (the shorter
    length when one is a prefix of the other); None when they are equal. Pure."""
    if expected == received:
        return None
    for offset, (a, b) in enumerate(zip(expected, received, strict=False)):
        if a != b:
            return offset
    return min(len(expected), len(received))
