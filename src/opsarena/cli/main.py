"""The `opsarena` command: sub-command groups are registered here; each lives in its own module.

Every `OpsArenaError` (and every usage error typer finds) is printed as one
line on stderr with exit code 2.
"""

from __future__ import annotations

import sys

import typer

from opsarena.cli import challenges as challenges_cli
from opsarena.cli import db as db_cli
from opsarena.cli import hosts as hosts_cli
from opsarena.cli import image as image_cli
from opsarena.cli import records as records_cli
from opsarena.cli import run as run_cli
from opsarena.cli import serve as serve_cli
from opsarena.cli import tournament as tournament_cli
from opsarena.cli import verify as verify_cli
from opsarena.cli.output import fail
from opsarena.errors import OpsArenaError

app = typer.Typer(
    name="opsarena",
    help="Live infrastructure challenges on isolated systemd hosts, judged by a referee.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(challenges_cli.app, name="challenges")
app.add_typer(db_cli.app, name="db")
app.add_typer(hosts_cli.app, name="hosts")
app.add_typer(image_cli.app, name="image")
app.add_typer(tournament_cli.app, name="tournament")
app.command("run")(run_cli.run)
app.command("demo")(run_cli.demo)
app.command("done")(run_cli.done)
app.command("resume")(run_cli.resume)
app.command("show")(records_cli.show)
app.command("ls")(records_cli.ls)
app.command("events")(records_cli.events)
app.command("serve")(serve_cli.serve)
app.command("leaderboard")(tournament_cli.leaderboard_command)
app.command("verify")(verify_cli.verify)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; exit 2 with one line for anything the user can fix."""
    command = typer.main.get_command(app)
    try:
        # Without standalone mode, click returns the code of a `typer.Exit` instead of exiting.
        code = command.main(args=argv, prog_name="opsarena", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        fail("aborted", code=130)
    except typer.TyperException as exc:
        context = getattr(exc, "ctx", None)
        path = context.command_path if context is not None else "opsarena"
        where = f"{path}: " if path != "opsarena" else ""
        fail(f"{where}{exc.format_message()}", code=2)
    except OpsArenaError as exc:
        fail(str(exc), code=2)
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
