"""`opsarena serve`: the live scoreboard of an event log, in a browser."""

from __future__ import annotations

from typing import Annotated

import typer

from opsarena.cli.output import err_console
from opsarena.cli.records import DbOption
from opsarena.store import describe_target
from opsarena.web import DEFAULT_HOST, DEFAULT_PORT, bind, create_app, serve_forever
from opsarena.web.server import url_of


def serve(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (loopback unless told).")
    ] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port (0: any free port).")
    ] = DEFAULT_PORT,
    db: DbOption = None,
) -> None:
    """Serve the scoreboard: matches, live match pages, a JSON API (read-only)."""
    app = create_app(db)
    sock = bind(host, port)
    err_console.print(
        f"scoreboard of {describe_target(db)} at {url_of(sock)}/"
        "  (JSON API under /api, Ctrl-C stops)",
        markup=False,
        soft_wrap=True,
    )
    serve_forever(app, sock)
