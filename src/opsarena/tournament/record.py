"""The tournament's events and their fold: the tournament record, made only from its log.

A tournament is event-sourced in the match event log, in a stream of its own whose id is
`tournament:ID` (match ids never contain `:`). Events:

- `tournament_created`: the file's text and source, the seed and its commitment, the
  schedule (every slot: number, challenge, trial, group);
- `tournament_started`: a controller took the tournament up (run or resume), with the
  number of matches it plays at once on its machine;
- `slot_match_started`: an attempt at a slot began, under the match id given;
- `slot_match_ended`: that attempt's match closed; `counted` says whether it counts (a
  match aborted, or with an agent the arena interrupted, is void: `why` says so);
- `tournament_finished`: every slot has a counted match or has used up its replays.

`fold_tournament` is pure; an impossible log raises `EventLogError` naming the seq.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from opsarena.errors import EventLogError
from opsarena.store import StoredEvent

STREAM_PREFIX = "tournament:"


def stream_id(tournament_id: str) -> str:
    """The event-log stream of a tournament."""
    return f"{STREAM_PREFIX}{tournament_id}"


def is_tournament_stream(stream: str) -> bool:
    """Whether an event-log stream is a tournament's rather than a match's."""
    return stream.startswith(STREAM_PREFIX)


def seed_commitment(seed: bytes) -> str:
    """What a running tournament shows instead of its seed: SHA-256 of it, in hex."""
    return hashlib.sha256(seed).hexdigest()


class TournamentEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    event_type: ClassVar[str]


class SlotSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    slot: int = Field(ge=1)
    challenge: str
    trial: int = Field(ge=1)
    group: list[str] = Field(min_length=1)


class TournamentCreated(TournamentEvent):
    event_type: ClassVar[str] = "tournament_created"
    tournament_id: str
    name: str
    source: str
    base_dir: str
    text: str
    seed: str
    seed_commitment: str
    retries: int
    competitors: dict[str, str]
    """Competitor name to agent spec as written (`scripted:reference`)."""
    slots: list[SlotSpec] = Field(min_length=1)


class ControllerProcess(BaseModel):
    """Which process took the tournament up: enough to tell whether it still runs."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    pid: int
    start_ticks: int
    """The process's start time (clock ticks since boot, `/proc/PID/stat` field 22)."""
    boot_id: str


class TournamentStarted(TournamentEvent):
    event_type: ClassVar[str] = "tournament_started"
    parallel: int = Field(ge=1)
    resumed: bool = False
    controller: ControllerProcess | None = None


class SlotMatchStarted(TournamentEvent):
    event_type: ClassVar[str] = "slot_match_started"
    slot: int
    attempt: int = Field(ge=1)
    match_id: str


class SlotMatchEnded(TournamentEvent):
    event_type: ClassVar[str] = "slot_match_ended"
    slot: int
    attempt: int
    match_id: str
    counted: bool
    why: str = ""


class TournamentFinished(TournamentEvent):
    event_type: ClassVar[str] = "tournament_finished"


EVENT_MODELS: dict[str, type[TournamentEvent]] = {
    model.event_type: model
    for model in (
        TournamentCreated,
        TournamentStarted,
        SlotMatchStarted,
        SlotMatchEnded,
        TournamentFinished,
    )
}


class AttemptRecord(BaseModel):
    """One attempt at a slot: its match and, once it closed, whether it counts."""

    attempt: int
    match_id: str
    started_wall: str
    ended: bool = False
    counted: bool | None = None
    why: str = ""


class SlotRecord(BaseModel):
    slot: int
    challenge: str
    trial: int
    group: list[str]
    attempts: list[AttemptRecord] = Field(default_factory=list)

    @property
    def counted_match(self) -> str | None:
        """The match that counts for this slot, if one does."""
        return next((a.match_id for a in self.attempts if a.counted), None)

    @property
    def state(self) -> Literal["pending", "playing", "counted", "void"]:
        if not self.attempts:
            return "pending"
        last = self.attempts[-1]
        if not last.ended:
            return "playing"
        return "counted" if last.counted else "void"


class TournamentRecord(BaseModel):
    """The tournament so far. `seed` is None until the tournament finished (the
    commitment is always there, so the revealed seed can be checked against it)."""

    tournament_id: str
    name: str
    source: str
    base_dir: str
    state: Literal["running", "finished"]
    created_at: str
    finished_at: str | None = None
    seed_commitment: str
    seed: str | None = None
    retries: int
    competitors: dict[str, str]
    slots: list[SlotRecord]
    parallel: int = 1
    controller: ControllerProcess | None = None
    """The process that took the tournament up last."""
    runs: int = 0
    """How many times a controller took the tournament up (1 + resumes)."""
    last_sequence: int = 0

    def counted_matches(self) -> list[str]:
        """The match ids that count, in slot order."""
        return [m for slot in self.slots if (m := slot.counted_match) is not None]

    def summary_counts(self) -> dict[str, int]:
        counts = {"pending": 0, "playing": 0, "counted": 0, "void": 0}
        for slot in self.slots:
            counts[slot.state] += 1
        return counts


def fold_tournament(
    events: Iterable[StoredEvent], *, reveal_seed: bool = False
) -> TournamentRecord:
    """The record of one tournament from its stream's events in order. The seed is
    revealed once the tournament finished (or with `reveal_seed`, for the controller that
    resumes it). Raises `EventLogError` for an empty or impossible log."""
    folder = TournamentFolder()
    for event in events:
        folder.apply(event)
    return folder.record(reveal_seed=reveal_seed)


class TournamentFolder:
    """The same fold one event at a time, in constant time per event, for the controller
    and views that follow a long tournament."""

    def __init__(self) -> None:
        self._record: TournamentRecord | None = None
        self._seed = ""
        self._match_ids: set[str] = set()

    @property
    def last_sequence(self) -> int:
        return self._record.last_sequence if self._record is not None else 0

    def apply(self, event: StoredEvent) -> None:
        """Fold one more event; `EventLogError` when it cannot follow the ones before."""
        where = f"{event.match_id} seq {event.seq} ({event.type})"
        if event.seq != self.last_sequence + 1:
            raise EventLogError(f"{where}: expected seq {self.last_sequence + 1}")
        model = EVENT_MODELS.get(event.type)
        if model is None:
            raise EventLogError(f"{where}: unknown tournament event type {event.type!r}")
        try:
            data: Any = model.model_validate(event.data)
        except ValueError as exc:
            raise EventLogError(f"{where}: invalid data: {exc}") from None
        record = self._record
        if record is None:
            if not isinstance(data, TournamentCreated):
                raise EventLogError(f"{where}: a tournament log starts with tournament_created")
            self._seed = data.seed
            record = self._record = TournamentRecord(
                tournament_id=data.tournament_id,
                name=data.name,
                source=data.source,
                base_dir=data.base_dir,
                state="running",
                created_at=event.wall,
                seed_commitment=data.seed_commitment,
                retries=data.retries,
                competitors=data.competitors,
                slots=[SlotRecord(**s.model_dump()) for s in data.slots],
            )
        else:
            if isinstance(data, SlotMatchStarted) and data.match_id in self._match_ids:
                raise EventLogError(f"{where}: match {data.match_id} is played a second time")
            _apply(record, data, where, event.wall)
            if isinstance(data, SlotMatchStarted):
                self._match_ids.add(data.match_id)
        record.last_sequence = event.seq

    def record(self, *, reveal_seed: bool = False) -> TournamentRecord:
        """The record so far: the folder's own, which later `apply` calls change in place.
        Raises `EventLogError` before the first event."""
        if self._record is None:
            raise EventLogError("no tournament events")
        finished = self._record.state == "finished"
        self._record.seed = self._seed if finished or reveal_seed else None
        return self._record


def _apply(record: TournamentRecord, data: TournamentEvent, where: str, wall: str) -> None:
    if record.state == "finished":
        raise EventLogError(f"{where}: the tournament is finished already")
    if isinstance(data, TournamentCreated):
        raise EventLogError(f"{where}: a second tournament_created")
    if isinstance(data, TournamentStarted):
        record.parallel = data.parallel
        record.controller = data.controller
        record.runs += 1
        return
    if isinstance(data, TournamentFinished):
        record.state = "finished"
        record.finished_at = wall
        return
    assert isinstance(data, SlotMatchStarted | SlotMatchEnded)
    if not 1 <= data.slot <= len(record.slots):
        raise EventLogError(f"{where}: no slot {data.slot}")
    slot = record.slots[data.slot - 1]
    if isinstance(data, SlotMatchStarted):
        if slot.state in ("playing", "counted"):
            raise EventLogError(f"{where}: slot {data.slot} is {slot.state} already")
        if data.attempt != len(slot.attempts) + 1:
            raise EventLogError(f"{where}: slot {data.slot} attempt {data.attempt} out of order")
        slot.attempts.append(AttemptRecord(attempt=data.attempt, match_id=data.match_id,
                                           started_wall=wall))  # fmt: skip
        return
    last = slot.attempts[-1] if slot.attempts else None
    if last is None or last.ended or last.match_id != data.match_id:
        raise EventLogError(f"{where}: slot {data.slot} has no match {data.match_id} playing")
    last.ended = True
    last.counted = data.counted
    last.why = data.why
