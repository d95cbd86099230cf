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
| traffic       | a decoy stretch of the fault rounds' traffic (`plan_traffic`)          |

`plan_traffic` is the one generator of the fault rounds' traffic (docs/REFEREE.md, "A
fault round"): seeded steps of the write-read kind with the required kinds inside, the
fault after a seeded number of acknowledged PUTs, or none (a decoy).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from dataclasses import dataclass
from typing import Literal

from opsarena.ledger import Slot
from opsarena.workloads.records.derive import derive_record

LARGE_BYTES = 1024 * 1024
"""The brief promises values "up to at least 1 MiB"."""
PARALLEL_DISTINCT = 8
PARALLEL_SAME_ID = 4
PARALLEL_VALUE_BYTES = 512
UNWRITTEN_PROBES = 1
"""Never-written ids probed by each write-read attempt (the ledger probes more after faults)."""


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
    (`slot_kind`): text, binary, empty, large, `sized-<bytes>-<n>` (that many random
    bytes), else 512 random bytes."""
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
    if name.startswith("sized-"):  # sized-<bytes>-<n>: the traffic's values of random sizes
        return hashlib.shake_256(key).digest(int(name.split("-")[1]))
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


# The traffic of a fault round (and of write-read's tail): one seeded generator, so that
# nothing in what the service sees tells it whether, or when, a fault is coming.

TRAFFIC_ITEMS = 28
"""Items planned per round, each one to four steps (a PUT and its read-back, a GET...):
about 50 requests; a round stops early once its fault has returned."""
FAULT_AFTER_MAX = 12
"""The fault comes once the round's j-th PUT is acknowledged, j seeded in 1..this."""
FAULT_AFTER_DECAY = 0.6
"""P(j = k) is proportional to this to the power k - 1: most often early, sometimes late."""
DECOY_CHANCE = 0.1
"""The chance that a round has no fault (a decoy: the same traffic, every read checked)."""
DECOY_STEPS = (6, 16)
"""A decoy round runs this many of its steps (seeded in the range)."""
REQUIRED_KINDS = ("binary", "empty", "large", "overwrite")
"""Kinds every round's traffic holds once, at seeded positions (never the first)."""
SIZED_MAX_BITS = 14
"""Fresh values are 1 B to 2 ** this bytes (log-uniform)."""
PAUSES_MS = (0, 0, 1, 2, 4, 8, 15)
IDLE_MS = (40, 120)
IDLE_CHANCE = 0.04
HUSH_CHANCE = 0.5
"""The chance that a fault round's traffic falls silent at the acknowledgement the fault
waits for, until the fault is over: the fault then lands on a write no later request
followed, so a service that makes a write durable only when the next request comes
(or when it sees the traffic go on) loses it. Otherwise the traffic goes on during the
fault, and writes in flight at the destructive instant are judged too. A silence after
an acknowledgement is also ordinary traffic (`IDLE_MS`, and every round's end)."""
GROUP = (2, 4)
"""A parallel step PUTs this many fresh records at once (then GETs them at once)."""

OpKind = Literal["put", "get", "old", "unwritten"]


@dataclass(frozen=True)
class Op:
    """One request. `put`: PUT `slot`'s value under `id`; `get`: GET `id`, written earlier
    in the round (its last acknowledged value is expected); `old`: GET the `pick`-th of
    the ledger's older records (in a seeded order); `unwritten`: GET `id`, never written
    (404). `label` names it in a failure detail."""

    kind: OpKind
    id: str
    label: str
    slot: Slot | None = None
    pick: int = 0


@dataclass(frozen=True)
class Step:
    """Requests sent at once (one, or a parallel group), then a pause."""

    ops: tuple[Op, ...]
    pause_ms: int = 0


@dataclass(frozen=True)
class TrafficPlan:
    """One round's traffic: its steps in order, and after how many acknowledged PUTs the
    fault comes (0: a decoy round, no fault)."""

    steps: tuple[Step, ...]
    fault_after: int
    hush: bool = False
    """Fall silent at the `fault_after`-th acknowledgement until the fault is over
    (`HUSH_CHANCE`)."""

    def puts(self) -> list[Op]:
        return [op for step in self.steps for op in step.ops if op.kind == "put"]


def plan_traffic(
    seed: bytes,
    territory: str,
    milestone: str,
    attempt: int,
    name: str,
    *,
    text: Slot | None = None,
    decoy: bool | None = None,
) -> TrafficPlan:
    """One round's traffic, derived from the seed (pure): in seeded order, PUTs of fresh
    values of seeded sizes (1 B to 16 KiB), most read back at once as write-read does,
    GETs of records written earlier in the round, of older ledger records and of ids never
    written, now and then a parallel group of PUTs; the binary, empty, 1 MiB and
    overwritten values (and `text`, when given) at seeded positions inside it. A decoy
    (no fault) when `decoy` is true, never when it is false, else by a seeded draw of
    `DECOY_CHANCE`; otherwise the fault comes once the j-th PUT is acknowledged, j seeded
    in 1..`FAULT_AFTER_MAX`, early more often than late (`FAULT_AFTER_DECAY`)."""
    rng = random.Random(
        int.from_bytes(_key(seed, ["opsarena-traffic", territory, milestone, attempt, name]))
    )

    def slot(kind: str) -> Slot:
        return Slot(territory, milestone, attempt, f"{kind}@{name}")

    required = [*REQUIRED_KINDS, *(["text"] if text is not None else [])]
    positions = dict(zip(rng.sample(range(1, TRAFFIC_ITEMS), len(required)), required, strict=True))
    written: list[str] = []
    steps: list[Step] = []

    def add(*ops: Op) -> None:
        pause = rng.randint(*IDLE_MS) if rng.random() < IDLE_CHANCE else rng.choice(PAUSES_MS)
        steps.append(Step(ops, pause))

    def put(kind: str, *, label: str, id_of: Slot | None = None) -> Op:
        value_slot = text if kind == "text" and text is not None else slot(kind)
        record_id = slot_id(seed, id_of or value_slot)
        if record_id not in written:
            written.append(record_id)
        return Op("put", record_id, label, value_slot)

    def sized() -> Op:
        size = int(2 ** rng.uniform(0, SIZED_MAX_BITS))
        return put(f"sized-{size}-{len(written)}", label=f"{size}-byte value")

    def old() -> Op:
        return Op("old", "", "older record", pick=rng.randrange(1 << 16))

    def get(record_id: str, label: str = "read back") -> Op:
        return Op("get", record_id, label)

    for index in range(TRAFFIC_ITEMS):
        kind = positions.get(index)
        draw = rng.random()
        if kind == "overwrite":
            first = slot("overwrite-1")
            add(put("overwrite-1", label="overwrite (first value)"))
            add(get(slot_id(seed, first), "overwrite (first value)"))
            add(put("overwrite-2", label="overwrite (second value)", id_of=first))
            add(get(slot_id(seed, first), "overwrite"))
        elif kind is not None:
            add(put(kind, label=kind))
            add(get(written[-1], kind) if draw < 0.5 else old())
        elif draw < 0.45:
            add(sized())
            add(get(written[-1]))
        elif draw < 0.70 or (draw < 0.82 and not written):
            add(old())
        elif draw < 0.82:
            add(get(rng.choice(written), "read"))
        elif draw < 0.88:
            add(Op("unwritten", unwritten_id(seed, territory, milestone, attempt, 1000 + index),
                   "never written"))  # fmt: skip
        elif draw < 0.97:
            add(sized())
            add(old())
        else:
            group = [sized() for _ in range(rng.randint(*GROUP))]
            add(*group)
            add(*(get(op.id, "parallel read") for op in group))
    drawn = rng.random() < DECOY_CHANCE
    if decoy or (decoy is None and drawn):
        return TrafficPlan(tuple(steps[: rng.randint(*DECOY_STEPS)]), 0)
    weights = [FAULT_AFTER_DECAY**k for k in range(FAULT_AFTER_MAX)]
    after = rng.choices(range(1, FAULT_AFTER_MAX + 1), weights)[0]
    puts = sum(op.kind == "put" for step in steps for op in step.ops)
    return TrafficPlan(tuple(steps), min(after, puts), hush=rng.random() < HUSH_CHANCE)
