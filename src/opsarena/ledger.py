"""The durability ledger: every write a territory's service acknowledged, and how re-reads ended.

As in Jepsen's history, a PUT answered 2xx is *acknowledged*: from then on a GET of its
id must return its bytes (or, after an overwrite, the newer bytes). A PUT whose answer
never came is *indeterminate*: its value and the one before it (or a 404 when there was
none) are both correct later. The ledger keeps, per id, the sha256 of each correct value
and of the older ones, plus the `Slot` that regenerates the bytes from the seed; it never
keeps bytes.

Each re-read ends as `ok`, `lost` (404), `corrupted` (other bytes), `stale` (an older
value of an overwritten id), or, for an id never written, `unexpected` (200). A record
that ends lost, corrupted or stale fails its attempt and is then dropped, so a
competitor who fixes its service can pass a later attempt; the counts are kept.

The ledger changes only through `LedgerUpdate`s (one per attempt, the `ledger_update`
event), so the referee, `opsarena resume` and the record's fold rebuild exactly the same
ledger from the log. Re-reads are bounded (`REREAD_MAX_RECORDS`, `REREAD_MAX_BYTES`):
beyond the bound a deterministic sample (ordered by HMAC of the seed) is re-read, always
including the current attempt's own records. Everything here is pure.

It sits below the referee (it imports nothing of opsarena's), so the record's fold and
the event log read a ledger without importing any judging code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

REREAD_MAX_RECORDS = 256
"""At most this many ledger records are re-read after one fault."""
REREAD_MAX_BYTES = 32 * 1024 * 1024
"""At most this many value bytes are re-read after one fault."""
UNWRITTEN_AFTER_FAULT = 3
"""Never-written ids probed after every fault."""

Outcome = Literal["ok", "lost", "corrupted", "stale", "unexpected"]


@dataclass(frozen=True)
class Slot:
    """Where one value comes from: enough to regenerate its id and bytes from the seed
    (the workload that wrote it does; the ledger keeps only the slot and a hash)."""

    territory: str
    milestone: str
    attempt: int
    name: str

    def label(self) -> list[str | int]:
        return ["opsarena-slot", self.territory, self.milestone, self.attempt, self.name]


class LedgerWrite(BaseModel):
    """One PUT the service answered 2xx (`acknowledged`) or never answered
    (`indeterminate`). `concurrent` writes join the id's correct values instead of
    replacing them (4 parallel PUTs to one id: any one of them is correct, whichever was
    acknowledged first)."""

    model_config = ConfigDict(frozen=True)

    id: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    slot: str
    slot_milestone: str
    slot_attempt: int = Field(ge=0)
    state: Literal["acknowledged", "indeterminate"] = "acknowledged"
    concurrent: bool = False


class LedgerCounts(BaseModel):
    """How re-reads ended (counts; each an increment in an update, totals in a summary)."""

    verified: int = Field(default=0, ge=0)
    lost: int = Field(default=0, ge=0)
    corrupted: int = Field(default=0, ge=0)
    stale: int = Field(default=0, ge=0)
    unexpected: int = Field(default=0, ge=0)
    forgiven: int = Field(default=0, ge=0)
    """Lost or stale records the challenge allowed to be (a recovery point objective)."""


class LedgerUpdate(BaseModel):
    """What one attempt did to a territory's ledger: the `ledger_update` event's data."""

    territory: str
    milestone: str
    attempt: int = Field(ge=1)
    writes: list[LedgerWrite] = Field(default_factory=list)
    checked: LedgerCounts = Field(default_factory=LedgerCounts)
    dropped: list[str] = Field(default_factory=list)
    """Ids dropped after they were found lost, corrupted or stale."""
    settled: dict[str, str] = Field(default_factory=dict)
    """Id -> sha256 of the value a read returned among several correct ones (concurrent
    PUTs to one id): from then on only that value is correct, the others are older."""

    @property
    def empty(self) -> bool:
        return (
            not self.writes
            and not self.dropped
            and not self.settled
            and self.checked == LedgerCounts()
        )


class LedgerSummary(BaseModel):
    """The record's per-territory `ledger`: totals over the whole match."""

    acknowledged: int = 0
    indeterminate: int = 0
    verified: int = 0
    lost: int = 0
    corrupted: int = 0
    stale: int = 0
    unexpected: int = 0
    forgiven: int = 0
    """Lost or stale records the challenge allowed to be (backup-restore's recovery
    point objective); dropped like the others, but not a failure."""
    records: int = 0
    """Records in the ledger now (acknowledged, not dropped)."""


@dataclass
class Entry:
    """One id in the ledger: the sha256 of each value that is correct now, of the older
    values, and the slots that regenerate the correct ones."""

    id: str
    accepted: list[str]
    slots: list[Slot]
    sizes: list[int]
    older: list[str] = field(default_factory=list)
    absent_ok: bool = False
    """True while a 404 is correct too (the only write so far was indeterminate)."""

    @property
    def size(self) -> int:
        return max(self.sizes, default=0)


def classify(entry: Entry, status: int, body_sha256: str | None) -> Outcome | None:
    """How a re-read of `entry` that answered `status` (with a body hashing to
    `body_sha256`) ended; None for a status that is neither 200 nor 404 (the check
    reports it as `bad_status`). Pure."""
    if status == 404:
        return "ok" if entry.absent_ok else "lost"
    if status != 200:
        return None
    if body_sha256 in entry.accepted:
        return "ok"
    if body_sha256 in entry.older:
        return "stale"
    return "corrupted"


class Ledger:
    """One territory's ledger. Change it only with `apply` (and build updates with
    `Pending`), so every copy folded from the same events is the same."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.summary = LedgerSummary()

    def apply(self, update: LedgerUpdate, *, writes: bool = True) -> None:
        """Fold one update in: writes first (unless `writes` is false: the referee's own
        ledger took them live, through `Pending`), then the counts, then the drops."""
        for write in update.writes if writes else ():
            self.write(write)
        c = update.checked
        s = self.summary
        s.verified += c.verified
        s.lost += c.lost
        s.corrupted += c.corrupted
        s.stale += c.stale
        s.unexpected += c.unexpected
        s.forgiven += c.forgiven
        for record_id, sha256 in update.settled.items():
            self.settle(record_id, sha256)
        for record_id in update.dropped:
            self.entries.pop(record_id, None)
        s.records = len(self.entries)

    def write(self, write: LedgerWrite) -> None:
        """Take one write in (use `apply`, or `Pending.write` during an attempt)."""
        slot = Slot("", write.slot_milestone, write.slot_attempt, write.slot)
        entry = self.entries.get(write.id)
        if write.state == "acknowledged":
            self.summary.acknowledged += 1
        else:
            self.summary.indeterminate += 1
        if entry is None:
            self.entries[write.id] = Entry(
                write.id,
                [write.sha256],
                [slot],
                [write.size],
                absent_ok=write.state == "indeterminate",
            )
            return
        if write.concurrent or write.state == "indeterminate":
            entry.accepted.append(write.sha256)
            entry.slots.append(slot)
            entry.sizes.append(write.size)
            return
        entry.older.extend(h for h in entry.accepted if h != write.sha256)
        entry.accepted, entry.slots, entry.sizes = [write.sha256], [slot], [write.size]
        entry.absent_ok = False

    def settle(self, record_id: str, sha256: str) -> None:
        """A read of `record_id` returned the correct value `sha256` among several: only
        it stays correct (use `apply`, or `Pending.settle` during an attempt)."""
        entry = self.entries.get(record_id)
        if entry is None or sha256 not in entry.accepted or len(entry.accepted) < 2:
            return
        keep = entry.accepted.index(sha256)
        entry.older.extend(h for h in entry.accepted if h != sha256)
        entry.accepted = [sha256]
        entry.slots, entry.sizes = [entry.slots[keep]], [entry.sizes[keep]]
        entry.absent_ok = False

    def owner_of(self, sha256: str) -> str | None:
        """The id whose correct value hashes to `sha256`, if any (a value served under
        the wrong id)."""
        for entry in self.entries.values():
            if sha256 in entry.accepted:
                return entry.id
        return None

    def sample(self, seed: bytes, territory: str, key: str, must: set[str]) -> list[Entry]:
        """The entries to re-read after one fault: every one when within the bounds, else
        `must` (this attempt's own ids) and then a deterministic sample ordered by HMAC of
        the seed over (`territory`, `key`, id), until either bound is reached."""
        entries = list(self.entries.values())
        total = sum(e.size for e in entries)
        if len(entries) <= REREAD_MAX_RECORDS and total <= REREAD_MAX_BYTES:
            return entries

        def rank(entry: Entry) -> bytes:
            message = json.dumps(["opsarena-sample", territory, key, entry.id]).encode()
            return hmac.new(seed, message, hashlib.sha256).digest()

        chosen = [e for e in entries if e.id in must]
        budget = REREAD_MAX_BYTES - sum(e.size for e in chosen)
        for entry in sorted((e for e in entries if e.id not in must), key=rank):
            if len(chosen) >= REREAD_MAX_RECORDS:
                break
            if entry.size > budget:
                continue
            chosen.append(entry)
            budget -= entry.size
        return chosen


class Pending:
    """The update one attempt is building: writes as they are acknowledged, re-read
    outcomes as they come. `update()` is what the referee emits and applies."""

    def __init__(
        self, territory: str, milestone: str, attempt: int, ledger: Ledger | None = None
    ) -> None:
        self.territory, self.milestone, self.attempt = territory, milestone, attempt
        self.ledger = ledger
        """When given, each write is taken into `ledger` at once (so a re-read later in
        the same attempt sees it); `update()` still carries it for the log."""
        self.writes: list[LedgerWrite] = []
        self.checked = LedgerCounts()
        self.dropped: list[str] = []
        self.settled: dict[str, str] = {}

    def write(
        self,
        record_id: str,
        value: bytes,
        slot: Slot,
        *,
        acknowledged: bool,
        concurrent: bool = False,
    ) -> None:
        write = LedgerWrite(
            id=record_id,
            sha256=hashlib.sha256(value).hexdigest(),
            size=len(value),
            slot=slot.name,
            slot_milestone=slot.milestone,
            slot_attempt=slot.attempt,
            state="acknowledged" if acknowledged else "indeterminate",
            concurrent=concurrent,
        )
        self.writes.append(write)
        if self.ledger is not None:
            self.ledger.write(write)

    def count(self, outcome: Outcome, record_id: str | None = None) -> None:
        if outcome == "ok":
            self.checked.verified += 1
            return
        setattr(self.checked, outcome, getattr(self.checked, outcome) + 1)
        if record_id is not None and outcome != "unexpected" and record_id not in self.dropped:
            self.dropped.append(record_id)

    def settle(self, record_id: str, sha256: str) -> None:
        """A read of `record_id` returned `sha256`, one of its several correct values."""
        self.settled[record_id] = sha256
        if self.ledger is not None:
            self.ledger.settle(record_id, sha256)

    def forgive(self, record_id: str) -> None:
        """`record_id` read back lost or stale where the challenge allows it: counted as
        forgiven and dropped (a later re-read must not find it missing again)."""
        self.checked.forgiven += 1
        if record_id not in self.dropped:
            self.dropped.append(record_id)

    def update(self) -> LedgerUpdate:
        return LedgerUpdate(
            territory=self.territory,
            milestone=self.milestone,
            attempt=self.attempt,
            writes=list(self.writes),
            checked=self.checked.model_copy(),
            dropped=list(self.dropped),
            settled=dict(self.settled),
        )
