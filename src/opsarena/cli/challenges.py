"""`opsarena challenges`: list the challenges (built-in and installed packages'), print a
brief, validate a directory, calibrate a challenge on real hosts, scaffold a new one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from opsarena.challenges import (
    Challenge,
    find_challenge,
    load_challenge,
)
from opsarena.challenges.calibrate import Measured, load_calibration, podman_hosts, run_calibration
from opsarena.challenges.catalog import (
    CHALLENGE_FILE,
    challenge_names,
    named_challenge,
    placed_files,
)
from opsarena.challenges.scaffold import scaffold
from opsarena.cli.output import console, err_console, printable
from opsarena.errors import ChallengeError, UsageError
from opsarena.referee.contract import brief_for
from opsarena.referee.failures import reason_problems
from opsarena.referee.nemesis import faults_needed

app = typer.Typer(
    help="Challenges (built-in and installed) and challenge files.", no_args_is_help=True
)


def challenges_at(path: Path) -> list[Challenge]:
    """The challenge directory `path`, or the challenge directories right under it.
    Raises `ChallengeError` when there is none, or one of them is not valid."""
    if (path / CHALLENGE_FILE).is_file():
        return [load_challenge(path)]
    if not path.is_dir():
        raise ChallengeError(f"--path {path}: no such directory")
    found = [load_challenge(d) for d in sorted(path.iterdir()) if (d / CHALLENGE_FILE).is_file()]
    if not found:
        raise ChallengeError(f"--path {path}: no challenge directory (no {CHALLENGE_FILE}) in it")
    return found


@app.command("ls")
def ls(
    paths: Annotated[
        list[Path] | None,
        typer.Option("--path", help="Also list this challenge directory, or those in it (repeat)."),
    ] = None,
) -> None:
    """List the challenges (built-in, those installed packages provide, and those of
    `--path`): each one's milestones with their points, and faults."""
    table = Table("title", "milestones (points)", "points", "faults", "time limit")
    table.columns.insert(0, Column("name", no_wrap=True))
    listed = [named_challenge(name) for name in challenge_names()]
    for path in paths or []:
        listed += challenges_at(path)
    for challenge in listed:
        table.add_row(
            challenge.name,
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


@app.command("calibrate")
def calibrate(
    name: Annotated[str, typer.Argument(help="A built-in challenge, or a challenge directory.")],
    builders: Annotated[
        str | None,
        typer.Option("--builders", help="Only these builders, comma-separated (a,b)."),
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=8, help="Builders calibrated at once.")
    ] = 1,
    driver: Annotated[str, typer.Option("--driver", help="Host driver.")] = "podman",
) -> None:
    """Run the challenge's calibration (calibration.toml) on real hosts: each builder
    alone on a fresh host; print expected vs measured points and stop; exit 1 on any
    mismatch."""
    challenge = find_challenge(name)
    plan = load_calibration(challenge)
    chosen = None
    if builders is not None:
        chosen = [b.strip() for b in builders.split(",") if b.strip()]
        if not chosen:
            raise UsageError("--builders names no builder: give a,b")
    selected = plan.select(chosen)

    def report(measured: Measured) -> None:
        seed = measured.seed.decode(errors="replace")
        console.print(f"{measured.line()} (seed {seed})", markup=False, soft_wrap=True)

    console.print(
        f"calibrating {challenge.name}: {len(selected)} builder(s) on {driver} hosts",
        markup=False,
    )
    results = asyncio.run(
        run_calibration(
            plan, podman_hosts(plan.challenge, driver=driver), chosen, parallel=parallel,
            report=report,
        )
    )  # fmt: skip
    bad = [m for m in results if not m.ok]
    console.print(
        f"{challenge.name}: {len(results) - len(bad)}/{len(results)} as calibrated"
        + (f"; MISMATCH: {', '.join(m.expected.builder for m in bad)}" if bad else ""),
        markup=False,
    )
    if bad:
        raise typer.Exit(1)


@app.command("new")
def new(
    path: Annotated[
        str, typer.Argument(help="The new challenge directory (its name is the challenge's).")
    ],
) -> None:
    """Scaffold a challenge directory (challenge.toml, checks.py, builders.py with
    `reference` and `idle`, calibration.toml, files/) that validates and calibrates."""
    directory = scaffold(path)
    console.print(
        f"{directory}: new challenge {directory.name!r}; check it with `opsarena challenges "
        f"validate {directory}`, calibrate it with `opsarena challenges calibrate {directory}`",
        markup=False,
        soft_wrap=True,
    )
