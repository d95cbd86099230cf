"""What `opsarena verify` decides: every problem in one match's log, as one line each.

Pure: it reads a `LogAudit` (every row stored under the match, the store's own last seq,
the quarantine) and checks the hash chain, the rows the arena set aside, and the seed's
commit-reveal. Nothing here trusts the fold: a forged log may not fold at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opsarena.match.commitment import reveal_problem
from opsarena.store import LogAudit, chain_problems


@dataclass(frozen=True)
class Verification:
    """The verdict on one match's log: `problems` (one line each, in seq order where they
    have one) and, for the success line, the head hash and the seed's state."""

    match_id: str
    events: int
    head: str
    seed: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """The one line printed when nothing is wrong."""
        return (
            f"match {self.match_id}: {self.events} events, hash chain intact "
            f"(head {self.head}); {self.seed}"
        )


def verify_log(audit: LogAudit) -> Verification:
    """Check `audit`'s chain, quarantine and seed commitment (see the module docstring)."""
    match_id = audit.match_id
    problems = [
        f"match {match_id} seq {p.seq}: {p.what}"
        for p in chain_problems([e.link() for e in audit.events], last_seq=audit.last_seq)
    ]
    for row in audit.quarantined:
        problems.append(
            f"match {match_id} seq {row.event.seq}: a {row.event.type} row the arena did not "
            f"append, quarantined at {row.quarantined_wall}"
        )
    for event in audit.events:
        if event.type == "log_tampered" and event.data.get("kind") == "altered":
            seqs = event.data.get("seqs")
            for seq in seqs if isinstance(seqs, list) else [event.data.get("first_seq")]:
                problems.append(
                    f"match {match_id} seq {seq}: altered after the arena appended it "
                    f"(found at the close, log_tampered at seq {event.seq})"
                )
    seed, seed_problem = _seed_state(match_id, audit)
    if seed_problem:
        problems.append(f"match {match_id}: {seed_problem}")
    appended = [e for e in audit.events if e.seq <= audit.last_seq]
    head = appended[-1].hash if appended else ""
    return Verification(match_id, len(appended), head, seed, problems)


def _seed_state(match_id: str, audit: LogAudit) -> tuple[str, str | None]:
    """(the seed's state for the success line, a problem or None)."""
    appended = [e for e in audit.events if e.seq <= audit.last_seq]
    created = next((e.data for e in appended if e.type == "match_created"), None)
    closed = next((e.data for e in appended if e.type == "match_closed"), None)
    if created is None:
        return "", "no match_created event"
    commitment = _text(created, "seed_commitment")
    if commitment is None:
        if _text(created, "seed") is not None:
            return "seed in the open from the start (a log from before commitments)", None
        return "", "match_created has neither a seed commitment nor a seed"
    if closed is None:
        return f"seed not revealed yet (match not closed), commitment {commitment}", None
    revealed = _text(closed, "seed")
    if revealed is None:
        return "", "match_closed does not reveal the committed seed"
    problem = reveal_problem(match_id, commitment, revealed, _text(closed, "seed_nonce") or "")
    if problem is not None:
        return "", problem
    return f"revealed seed {revealed} matches its commitment", None


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None
