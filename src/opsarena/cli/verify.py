"""`opsarena verify MATCH`: check a match's hash chain and seed commitment, say where it breaks.

Exit 0 when the log is intact (one summary line), 1 when it is not (one line per problem,
the first bad seq first), 2 for bad input (no such log or match). The log is opened
read-only: verifying never changes it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from opsarena.cli.output import console
from opsarena.cli.records import DbOption
from opsarena.errors import MatchNotFoundError
from opsarena.match.verify import verify_log
from opsarena.store import open_store


def verify(
    match_id: Annotated[str, typer.Argument(metavar="MATCH", help="Match id.")],
    db: DbOption = None,
) -> None:
    """Check a match's event log: the hash chain, rows set aside, the seed commitment."""
    with open_store(db, read_only=True) as store:
        audit = asyncio.run(store.audit(match_id))
    if not audit.events and not audit.quarantined and audit.last_seq == 0:
        raise MatchNotFoundError(
            f"no match {match_id!r} in the event log: `opsarena ls` lists them"
        )
    verdict = verify_log(audit)
    if verdict.ok:
        console.print(verdict.summary(), markup=False, soft_wrap=True)
        return
    for problem in verdict.problems:
        console.print(problem, markup=False, soft_wrap=True)
    raise typer.Exit(1)
