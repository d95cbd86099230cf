"""`opsarena challenges`: list the built-in challenges, print a brief, validate a file."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from opsarena.challenges import builtin_challenge, builtin_names, find_challenge, load_challenge
from opsarena.cli.output import console, err_console
from opsarena.errors import ChallengeError

app = typer.Typer(help="Built-in challenges and challenge files.", no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    """List the built-in challenges."""
    table = Table("name", "title", "milestones", "points", "time limit")
    for name in builtin_names():
        challenge = builtin_challenge(name)
        table.add_row(
            name,
            challenge.title,
            " → ".join(m.id for m in challenge.milestones),
            str(challenge.total_points),
            f"{challenge.time_limit_s} s",
        )
    console.print(table)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="A built-in challenge, or a challenge file.")],
) -> None:
    """Print a challenge's brief: what a competitor reads."""
    challenge = find_challenge(name)
    console.print(f"# {challenge.title}\n", markup=False)
    console.print(challenge.brief.strip(), markup=False, soft_wrap=True)


@app.command("validate")
def validate(
    file: Annotated[str, typer.Argument(help="Challenge file (TOML).")],
) -> None:
    """Check a challenge file: one line per problem (file, field, what is wrong), exit 2."""
    try:
        challenge = load_challenge(file)
    except ChallengeError as exc:
        for problem in exc.problems:
            err_console.print(f"opsarena: error: {problem}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(
        f"{file}: valid challenge {challenge.name!r} ({len(challenge.milestones)} milestones, "
        f"{challenge.total_points} points)",
        markup=False,
        soft_wrap=True,
    )
