"""`opsarena challenges`: list the challenges (built-in and installed packages'), print a
brief, validate a directory."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Column, Table

from opsarena.challenges import (
    Challenge,
    find_challenge,
    load_challenge,
)
from opsarena.challenges.catalog import challenge_names, named_challenge, placed_files
from opsarena.cli.output import console, err_console, printable
from opsarena.errors import ChallengeError
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import reason_problems
from opsarena.referee.nemesis import faults_needed

app = typer.Typer(
    help="Challenges (built-in and installed) and challenge files.", no_args_is_help=True
)


@app.command("ls")
def ls() -> None:
    """List the challenges (built-in, and those installed packages provide): each one's
    milestones with their points, and faults."""
    table = Table("title", "milestones (points)", "points", "faults", "time limit")
    table.columns.insert(0, Column("name", no_wrap=True))
    for name in challenge_names():
        challenge = named_challenge(name)
        table.add_row(
            name,
            challenge.title,
            " → ".join(f"{m.id} ({m.points})" for m in challenge.milestones),
            str(challenge.total_points),
            ", ".join(faults_needed(challenge)) or "none",
            f"{challenge.time_limit_s} s",
        )
    console.print(table)


def whole_problems(challenge: Challenge) -> list[str]:
    """What `load_challenge` cannot see alone: failure reasons the referee's table has
    already."""
    source = str(challenge.origin or challenge.name)
    return [f"{source}: {line}" for line in reason_problems(challenge)]


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="A challenge's name, or a challenge directory.")],
    seed: Annotated[
        str, typer.Option("--seed", help="The match seed (hex) the brief's variants derive from.")
    ] = "00" * 32,
) -> None:
    """Print a challenge's brief: what a competitor reads (in the match of `--seed`)."""
    challenge = find_challenge(name)
    try:
        seed_bytes = bytes.fromhex(seed)
    except ValueError:
        raise ChallengeError(f"--seed {seed!r} is not hex") from None
    console.print(f"# {challenge.title}\n", markup=False)
    console.print(brief_for(challenge, seed_bytes).strip(), markup=False, soft_wrap=True)


@app.command("validate")
def validate(
    file: Annotated[str, typer.Argument(help="Challenge directory (or a lone TOML file).")],
) -> None:
    """Check a challenge directory: its TOML, checks file, setup, brief variables, files
    and failure reasons; one line per problem (file, field, what is wrong), exit 2."""
    try:
        challenge = load_challenge(file)
    except ChallengeError as exc:
        for problem in exc.problems or [str(exc)]:
            err_console.print(
                f"opsarena: error: {printable(problem)}", markup=False, soft_wrap=True
            )
        raise typer.Exit(2) from None
    problems = whole_problems(challenge)
    for problem in problems:
        err_console.print(f"opsarena: error: {printable(problem)}", markup=False, soft_wrap=True)
    if problems:
        raise typer.Exit(2)
    console.print(
        f"{file}: valid challenge {challenge.name!r} ({len(challenge.milestones)} milestones, "
        f"{challenge.total_points} points, {len(placed_files(challenge))} files placed)",
        markup=False,
        soft_wrap=True,
    )
