"""Tournaments: many matches from one file, event-sourced and resumable, and their outcomes.

- `spec`: the tournament file, its validation and the schedule;
- `record`: the tournament's events (stream `tournament:ID`) and their fold;
- `runner`: the controller that plays the schedule and resumes it after a kill;
- `outcomes`: which matches count, and the rating inputs of their records;
- `capacity`: matches at once on this machine, and the estimated time left.
"""

from opsarena.tournament.capacity import eta_s, machine_parallel
from opsarena.tournament.outcomes import (
    log_outcomes,
    outcome_of,
    read_record,
    tournament_outcomes,
    void_reason,
)
from opsarena.tournament.record import (
    STREAM_PREFIX,
    TournamentRecord,
    fold_tournament,
    is_tournament_stream,
    seed_commitment,
    stream_id,
)
from opsarena.tournament.runner import (
    TournamentRunner,
    load_tournament_record,
    new_tournament_id,
    slot_match_id,
)
from opsarena.tournament.spec import (
    Slot,
    TournamentPlan,
    load_tournament,
    match_seed,
    parse_tournament,
    schedule,
)

__all__ = [
    "STREAM_PREFIX",
    "Slot",
    "TournamentPlan",
    "TournamentRecord",
    "TournamentRunner",
    "eta_s",
    "fold_tournament",
    "is_tournament_stream",
    "load_tournament",
    "load_tournament_record",
    "log_outcomes",
    "machine_parallel",
    "match_seed",
    "new_tournament_id",
    "outcome_of",
    "parse_tournament",
    "read_record",
    "schedule",
    "seed_commitment",
    "slot_match_id",
    "stream_id",
    "tournament_outcomes",
    "void_reason",
]
