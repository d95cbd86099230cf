"""The web scoreboard: `opsarena serve`'s JSON API, server-sent events and static pages."""

from opsarena.web.app import create_app
from opsarena.web.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ScoreboardServer,
    bind,
    scoreboard_while,
    serve_forever,
    start_scoreboard,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ScoreboardServer",
    "bind",
    "create_app",
    "scoreboard_while",
    "serve_forever",
    "start_scoreboard",
]
