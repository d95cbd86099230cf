"""What a `--db` value (or `$OPSARENA_DB`) names: an SQLite file, or a PostgreSQL database."""

from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

DB_ENV = "OPSARENA_DB"

_URL_RE = re.compile(r"^postgres(ql)?://", re.IGNORECASE)
_PASSWORD_RE = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_PARAM_RE = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def is_postgres_url(target: object) -> bool:
    """Whether `target` is a libpq URL (`postgresql://...` / `postgres://...`)."""
    return isinstance(target, str) and _URL_RE.match(target) is not None


def platform_db_path() -> Path:
    """`opsarena.db` in the user's data directory: the only event log whose directory the
    store creates (and keeps 0700)."""
    return platformdirs.user_data_path("opsarena") / "opsarena.db"


def default_db_path() -> Path:
    """The default SQLite file: `$OPSARENA_DB` when that is a path, else `platform_db_path`."""
    override = os.environ.get(DB_ENV)
    if override and not is_postgres_url(override):
        return Path(override).expanduser()
    return platform_db_path()


def default_target() -> str:
    """`$OPSARENA_DB` if set (a path or a PostgreSQL URL), else the default SQLite file."""
    override = os.environ.get(DB_ENV)
    if override and is_postgres_url(override):
        return override
    return str(default_db_path())


def resolve_target(target: Path | str | None) -> str:
    """A `--db` value as the store opens it: a URL unchanged, a path expanded, None → the
    default."""
    if target is None:
        return default_target()
    text = str(target)
    return text if is_postgres_url(text) else str(Path(text).expanduser())


def describe_target(target: Path | str | None) -> str:
    """How messages name the event log: the path, or the URL without its password."""
    text = _PASSWORD_RE.sub(r"\1***@", resolve_target(target))
    return _PASSWORD_PARAM_RE.sub(r"\1***", text)
