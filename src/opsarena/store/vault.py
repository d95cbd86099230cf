"""The seed vault: each running match's secrets, in files only the arena's user can read.

The vault of an event log `X.db` is the directory `X.db-secrets/` beside it (mode 0700);
each match's secrets are one JSON object in `MATCH_ID.json` (mode 0600), written
atomically (a temporary file in the same directory, fsync, rename). The controller writes
a match's seed and nonce there before the match is created, `opsarena resume` reads them
back, and the file is removed once the match's closing event has revealed them. Nothing
else reads it: not the web server, not the CLI's views, not `opsarena verify`.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import re
import stat
from pathlib import Path

from opsarena.errors import StoreError

MATCH_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A match id that is safe as a file name (every id `new_match_id` makes is)."""


class Vault(abc.ABC):
    """Where the arena keeps running matches' secrets (seed, nonce) until they are
    revealed: readable by the arena only. Methods raise `StoreError` (one line) when the
    vault cannot be used, `ValueError` for a match id that is not a safe name."""

    where: str
    """Where the vault is, for messages."""

    @abc.abstractmethod
    def put(self, match_id: str, secrets: dict[str, str]) -> None:
        """Store `secrets` (hex strings) for `match_id`, durably, replacing older ones."""

    @abc.abstractmethod
    def get(self, match_id: str) -> dict[str, str] | None:
        """The secrets stored for `match_id`; `None` when there are none."""

    @abc.abstractmethod
    def discard(self, match_id: str) -> None:
        """Forget `match_id`'s secrets (they have been revealed); no error when absent."""


class SeedVault(Vault):
    """The secrets of running matches, one 0600 file per match in a 0700 directory.

    Every method raises `StoreError` (one line) when the directory or a file cannot be
    used, and `ValueError` for a match id that is not a safe file name.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.where = str(directory)

    def _file(self, match_id: str) -> Path:
        if not MATCH_ID_RE.match(match_id):
            raise ValueError(f"match id {match_id!r} is not a safe file name")
        return self.directory / f"{match_id}.json"

    def _ensure_directory(self) -> None:
        """Make the directory (0700), or check it is a real directory of ours; refuse a
        symlink or a directory someone else owns (planted to catch the seed)."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(self.directory)
        except OSError as exc:
            raise StoreError(f"cannot use the seed vault {self.directory}: {exc}") from None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise self._not_ours()
        if (
            info.st_mode & 0o077
        ):  # tightened through a descriptor: a swapped-in link is not followed
            try:
                fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError as exc:
                raise StoreError(f"cannot use the seed vault {self.directory}: {exc}") from None
            try:
                info = os.fstat(fd)
                if info.st_uid != os.geteuid():
                    raise self._not_ours()
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)

    def _not_ours(self) -> StoreError:
        return StoreError(
            f"the seed vault {self.directory} is not a directory of this user "
            "(a symlink, or someone else's): remove it, or choose another --db"
        )

    def put(self, match_id: str, secrets: dict[str, str]) -> None:
        """Store `secrets` (hex strings) for `match_id`, durably, replacing older ones."""
        target = self._file(match_id)
        self._ensure_directory()
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        payload = json.dumps(secrets, sort_keys=True).encode()
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, payload)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, target)
            directory_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise StoreError(f"cannot write the seed vault {self.directory}: {exc}") from None

    def get(self, match_id: str) -> dict[str, str] | None:
        """The secrets stored for `match_id`; `None` when there are none."""
        target = self._file(match_id)
        try:
            raw = target.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the seed vault {self.directory}: {exc}") from None
        try:
            loaded = json.loads(raw)
        except ValueError:
            raise StoreError(f"the seed vault file {target} is not JSON") from None
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
        ):
            raise StoreError(f"the seed vault file {target} is not an object of strings")
        return loaded

    def discard(self, match_id: str) -> None:
        """Forget `match_id`'s secrets (they have been revealed); no error when absent."""
        try:
            self._file(match_id).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot write the seed vault {self.directory}: {exc}") from None
