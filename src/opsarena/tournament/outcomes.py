"""From match records to rating inputs: which matches count, and what each territory did.

A match counts when it finished and the arena did not spoil it: not `aborted`, and no
agent ended `interrupted` (the arena's failure, not the competitor's). Everything read
here comes from the fold of the match's log; keys the record gains later are ignored.
"""

from __future__ import annotations

from opsarena.errors import EventLogError
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord
from opsarena.ratings import Entry, MatchOutcome
from opsarena.store import EventStore
from opsarena.tournament.record import TournamentRecord, is_tournament_stream


def void_reason(record: MatchRecord | None) -> str | None:
    """Why the match does not count, or None when it does."""
    if record is None:
        return "the match never started"
    if record.match_state != "finished":
        return f"the match is {record.match_state}, not finished"
    if record.finish_reason == "aborted":
        return "the match was aborted"
    interrupted = sorted(n for n, a in record.agents.items() if a.terminal_state == "interrupted")
    if interrupted:
        return f"the arena interrupted {', '.join(interrupted)}"
    return None


def outcome_of(record: MatchRecord) -> MatchOutcome:
    """The rating input of a finished match: one entry per territory, named by its agent."""
    entries = []
    for territory in record.territories.values():
        agent = record.agents.get(territory.agent)
        passed = [
            m.passed_at_ms
            for m in territory.milestones.values()
            if m.passed and m.passed_at_ms is not None
        ]
        entries.append(
            Entry(
                competitor=territory.agent,
                durable_at_ms=territory.durable_at_ms,
                points=territory.milestone_points,
                last_passed_at_ms=max(passed) if passed else None,
                input_tokens=agent.input_tokens if agent else 0,
                output_tokens=agent.output_tokens if agent else 0,
                cost_microusd=agent.cost_microusd if agent else 0,
                cost_known=agent.cost_known if agent else False,
            )
        )
    return MatchOutcome(record.match_id, record.challenge, tuple(entries))


async def read_record(store: EventStore, match_id: str) -> MatchRecord | None:
    """The fold of a match's log; None when it has no events or cannot be folded."""
    events = await store.read(match_id)
    if not events:
        return None
    try:
        return fold_events(events)
    except EventLogError:
        return None


async def tournament_outcomes(store: EventStore, record: TournamentRecord) -> list[MatchOutcome]:
    """The outcomes of a tournament's counted matches, in slot order (each is checked
    again against its own log: a match whose log says it does not count is left out)."""
    outcomes = []
    for match_id in record.counted_matches():
        match = await read_record(store, match_id)
        if match is not None and void_reason(match) is None:
            outcomes.append(outcome_of(match))
    return outcomes


async def log_outcomes(store: EventStore, *, limit: int | None = None) -> list[MatchOutcome]:
    """The outcomes of every match in the log that counts (tournament or not), oldest
    first."""
    outcomes = []
    for summary in reversed(await store.list_matches(limit)):
        if is_tournament_stream(summary.match_id):
            continue
        match = await read_record(store, summary.match_id)
        if match is not None and void_reason(match) is None:
            outcomes.append(outcome_of(match))
    return outcomes
