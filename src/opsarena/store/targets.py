"""What a `--db` value (or `$OPSARENA_DB`) names: a URL (`scheme://...`), whose scheme
selects the store kind (`store.kinds`: `postgresql://` and `postgres://` for PostgreSQL), or
else the path of an SQLite file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

DB_ENV = "OPSARENA_DB"

_URL_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*)://(.*?)\s*$", re.DOTALL)
"""A URL: a scheme (RFC 3986; any case, surrounding blanks ignored) and `://`. Anything
else is a file path, taken as given."""
POSTGRES_SCHEMES = ("postgresql", "postgres")
_PASSWORD_RE = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_PARAM_RE = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def url_scheme(target: object) -> str | None:
    """The scheme of `target`, lower case, when it is a URL; None for a file path."""
    found = _URL_RE.match(target) if isinstance(target, str) else None
    return found.group(1).lower() if found else None


def normal_url(url: str) -> str:
    """`url` as a driver takes it: without surrounding blanks, its scheme in lower case
    (libpq refuses `POSTGRESQL://`). A file path is returned unchanged."""
    found = _URL_RE.match(url)
    return f"{found.group(1).lower()}://{found.group(2)}" if found else url


def is_postgres_url(target: object) -> bool:
    """Whether `target` is a libpq URL (`postgresql://...` / `postgres://...`)."""
    return url_scheme(target) in POSTGRES_SCHEMES


def platform_db_path() -> Path:
    """`opsarena.db` in the user's data directory: the only event log whose directory the
    store creates (and keeps 0700)."""
    return platformdirs.user_data_path("opsarena") / "opsarena.db"


def default_db_path() -> Path:
    """The default SQLite file: `$OPSARENA_DB` when that is a path, else `platform_db_path`."""
    override = os.environ.get(DB_ENV)
    if override and url_scheme(override) is None:
        return Path(override).expanduser()
    return platform_db_path()


def default_target() -> str:
    """`$OPSARENA_DB` if set (a path or a URL), else the default SQLite file."""
    override = os.environ.get(DB_ENV)
    if override and url_scheme(override) is not None:
        return normal_url(override)
    return str(default_db_path())


def resolve_target(target: Path | str | None) -> str:
    """A `--db` value as the store opens it: a URL normalised (`normal_url`), a path
    expanded, None → the default."""
    if target is None:
        return default_target()
    text = str(target)
    return normal_url(text) if url_scheme(text) is not None else str(Path(text).expanduser())


def describe_target(target: Path | str | None) -> str:
    """How messages name the event log: the path, or the URL without its password."""
    text = _PASSWORD_RE.sub(r"\1***@", resolve_target(target))
    return _PASSWORD_PARAM_RE.sub(r"\1***", text)
