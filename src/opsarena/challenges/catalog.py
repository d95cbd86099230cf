"""Reading challenge directories, and the built-in challenges shipped inside the package.

A challenge is a directory: `challenge.toml`, optionally the checks file it names
(`checks_file`, imported under a module name of its own so it may register checks and a
setup), and optionally `files/`, a tree copied onto each host (same paths under `/`)
before the agents start. `load_challenge(path)` takes the directory (or a lone TOML
file, which then has no checks file nor files), validates all of it (structure, check
names, setup and brief variables, files) and raises one `ChallengeError` whose
`problems` has one line per problem, each naming the file, the field and what is wrong.
Built-in challenges are the directories under `builtin/`. Installed packages add more
through the entry point group `opsarena.challenges` (`CHALLENGES`, a `Registry` of
challenge directories by name): an entry point names a module whose own directory holds
challenge directories (each a subdirectory with a `challenge.toml`), or a function
returning paths (each a challenge directory, or a directory holding some). A challenge
is named by its directory, which must match its `name`; a name taken twice (a package's
and a built-in, or two packages') is a `RegistryError`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from opsarena.errors import ChallengeError
from opsarena.hosts import Host
from opsarena.referee.contract import (
    check_names,
    load_checks_module,
    setup_of,
    setup_problems,
    unknown_checks,
)
from opsarena.referee.model import MODULE_PATTERN, Challenge, is_valid_name
from opsarena.registry import Registry
from opsarena.workloads.records import checks as records_checks

MAX_FILE_BYTES = 1024 * 1024
"""A challenge file larger than this is refused."""
CHALLENGE_FILE = "challenge.toml"
FILES_DIR = "files"
MAX_PLACED_BYTES = 16 * 1024 * 1024
"""All of a challenge's `files/` together may hold at most this many bytes."""
RECORDS_CHECKS_MODULE = records_checks.__name__
"""The checks a challenge file uses when it names neither `checks_module` nor
`checks_file`: the records workload's (`health`, `write-read`, the durability checks),
what such a file has always meant. The loader imports it, so its checks are registered
for every challenge (a file still naming their old module, `opsarena.referee.checks`,
finds them too)."""


@dataclass(frozen=True)
class PlacedFile:
    """One file of a challenge's `files/` tree: where it goes on the host, its bytes and
    its permission bits."""

    path: str
    data: bytes
    mode: int


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(file)"


def validation_problems(source: str, data: dict[str, Any]) -> tuple[Challenge | None, list[str]]:
    """Validate parsed TOML `data`; return the challenge (when valid) and one problem line
    per error, each `SOURCE: FIELD: what is wrong`. Pure apart from importing the
    challenge's checks module."""
    if "checks_module" not in data:
        data = {**data, "checks_module": RECORDS_CHECKS_MODULE}
    try:
        challenge = Challenge.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                message = "unknown field"
            elif error["type"] == "missing":
                message = "is required"
            problems.append(f"{source}: {_location(tuple(error['loc']))}: {message}")
        problems += [f"{source}: {line}" for line in _raw_check_problems(data)]
        return None, problems
    try:
        problems = [f"{source}: {line}" for line in unknown_checks(challenge)]
    except ChallengeError as exc:
        problems = [f"{source}: checks_module: {exc}"]
    return (None if problems else challenge), problems


def _raw_check_problems(data: dict[str, Any]) -> list[str]:
    """Unknown check names in a file that failed validation, so one run reports them too."""
    module = data.get("checks_module", RECORDS_CHECKS_MODULE)
    if not isinstance(module, str) or re.match(MODULE_PATTERN, module) is None:
        return []
    try:
        load_checks_module(module)
    except ChallengeError:
        return []
    milestones = data.get("milestones")
    if not isinstance(milestones, list):
        return []
    known = set(check_names())
    return [
        f"milestones[{index}].check: no check named {m['check']!r} "
        f"(registered: {', '.join(sorted(known)) or 'none'})"
        for index, m in enumerate(milestones)
        if isinstance(m, dict) and isinstance(m.get("check"), str) and m["check"] not in known
    ]


def parse_challenge(source: str, text: str) -> Challenge:
    """Parse and validate the TOML `text` of a challenge named `source` (a path or a
    built-in name, used in messages). Raises `ChallengeError` listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = f"{source}: (file): not valid TOML: {exc}"
        raise ChallengeError(problem, [problem]) from None
    return _validated(source, data)


def _read_text(file: Path) -> str:
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ChallengeError(f"{file}: (file): {size} bytes is over the {MAX_FILE_BYTES} limit")
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChallengeError(f"{file}: (file): no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChallengeError(f"{file}: (file): cannot be read: {exc}") from None


def _module_name(directory: Path, checks_file: str) -> str:
    """A module name of the challenge directory's own (stable for one directory)."""
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9_]", "_", checks_file.removesuffix(".py"))
    return f"opsarena_challenge_{digest}_{stem}"


def import_checks_file(directory: Path, checks_file: str) -> str:
    """Import `directory/checks_file` (once per process) and return its module name.
    Raises `ChallengeError` when it is missing or raises on import."""
    path = directory / checks_file
    name = _module_name(directory, checks_file)
    if name in sys.modules:
        return name
    if not path.is_file():
        raise ChallengeError(f"{directory / CHALLENGE_FILE}: checks_file: no file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ChallengeError(f"{path}: (file): cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ChallengeError(f"{path}: (file): importing it failed: {exc!r}") from None
    return name


def placed_files(challenge: Challenge) -> list[PlacedFile]:
    """The files the challenge's `files/` tree places on each host, sorted by path.
    Raises `ChallengeError` when one is a symlink or all of them are too large."""
    if challenge.directory is None:
        return []
    root = challenge.directory / FILES_DIR
    if not root.is_dir():
        return []
    placed: list[PlacedFile] = []
    total = 0
    for file in sorted(root.rglob("*")):
        if file.is_symlink():
            raise ChallengeError(f"{file}: (file): a symlink; files/ holds only plain files")
        if not file.is_file():
            continue
        data = file.read_bytes()
        total += len(data)
        if total > MAX_PLACED_BYTES:
            raise ChallengeError(f"{root}: (file): over {MAX_PLACED_BYTES} bytes in all")
        target = "/" + file.relative_to(root).as_posix()
        placed.append(PlacedFile(target, data, file.stat().st_mode & 0o7777))
    return placed


def load_challenge(path: str | Path) -> Challenge:
    """Load and validate the challenge directory (or lone TOML file) at `path`. Raises
    `ChallengeError` when anything is missing, unreadable, over a limit, or invalid."""
    given = Path(path)
    directory = given if given.is_dir() else None
    file = given / CHALLENGE_FILE if directory is not None else given
    text = _read_text(file)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = f"{file}: (file): not valid TOML: {exc}"
        raise ChallengeError(problem, [problem]) from None
    checks_file = data.get("checks_file")
    if isinstance(checks_file, str) and re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$", checks_file):
        if directory is None:
            problem = f"{file}: checks_file: only a challenge directory can have a checks file"
            raise ChallengeError(problem, [problem])
        try:
            data = {**data, "checks_module": import_checks_file(directory, checks_file)}
        except ChallengeError as exc:
            raise ChallengeError(str(exc), [str(exc)]) from None
    challenge = _validated(str(file), data)
    challenge.attach_origin(given.resolve(), directory=directory is not None)
    try:
        placed_files(challenge)
    except ChallengeError as exc:
        raise ChallengeError(str(exc), [str(exc)]) from None
    return challenge


def _validated(source: str, data: dict[str, Any]) -> Challenge:
    challenge, problems = validation_problems(source, data)
    if challenge is not None:
        problems = [f"{source}: {line}" for line in setup_problems(challenge)]
    if challenge is None or problems:
        summary = f"{source} is not a valid challenge ({len(problems)} problem(s)): " + "; ".join(
            p.removeprefix(f"{source}: ") for p in problems
        )
        raise ChallengeError(summary, problems)
    return challenge


def builtin_root() -> Path:
    """The directory holding the built-in challenge directories."""
    return Path(str(resources.files("opsarena.challenges") / "builtin"))


def challenge_directories(root: Path) -> list[Path]:
    """`root` itself when it is a challenge directory, else its subdirectories that are,
    sorted. Raises `ChallengeError` when `root` is not a directory."""
    if not root.is_dir():
        raise ChallengeError(f"{root}: (directory): no such directory of challenges")
    if (root / CHALLENGE_FILE).is_file():
        return [root.resolve()]
    return sorted(e.resolve() for e in root.iterdir() if (e / CHALLENGE_FILE).is_file())


def _provided(registry: Registry[Path], loaded: object) -> None:
    """Register the challenge directories an `opsarena.challenges` entry point gives: a
    module's own directory (a package's, or the one a module file is in) holds them; a
    function returns the paths holding them."""
    if isinstance(loaded, ModuleType):
        file = getattr(loaded, "__file__", None)
        if file is None:
            raise ChallengeError(f"module {loaded.__name__} has no file to find challenges by")
        roots: Iterable[object] = [Path(file).parent]
    elif callable(loaded):
        roots = loaded()
    else:
        raise ChallengeError(f"{loaded!r} is neither a module nor a function")
    for root in roots:
        if not isinstance(root, str | Path):
            raise ChallengeError(f"{root!r} is not a path")
        for directory in challenge_directories(Path(root)):
            registry.register(directory.name, directory)


CHALLENGES: Registry[Path] = Registry("challenge", "opsarena.challenges", on_load=_provided)
"""Every challenge directory by name: the built-ins (registered here) and the installed
packages' (their entry points read at the first ask for the list or an unknown name)."""
for _directory in challenge_directories(builtin_root()):
    CHALLENGES.register(_directory.name, _directory)


def builtin_names() -> list[str]:
    """Names of the built-in challenges, sorted."""
    return [d.name for d in challenge_directories(builtin_root())]


def challenge_names() -> list[str]:
    """Names of every challenge: the built-ins and the installed packages', sorted."""
    return CHALLENGES.names()


def builtin_challenge(name: str) -> Challenge:
    """The built-in challenge `name`. Raises `ChallengeError` when there is none."""
    if not is_valid_name(name) or name not in builtin_names():
        raise ChallengeError(
            f"no built-in challenge named {name!r}: `opsarena challenges ls` lists them"
        )
    return load_challenge(builtin_root() / name)


def named_challenge(name: str) -> Challenge:
    """The challenge `name`, built-in or from an installed package (`CHALLENGES`).
    Raises `ChallengeError` when there is none or its directory names another one."""
    directory = CHALLENGES.get(name) if is_valid_name(name) else None
    if directory is None:
        raise ChallengeError(
            f"no built-in challenge named {name!r}, nor one an installed package provides: "
            "`opsarena challenges ls` lists them"
        )
    challenge = load_challenge(directory)
    if challenge.name != name:
        raise ChallengeError(
            f"{directory / CHALLENGE_FILE}: name: {challenge.name!r} is not its "
            f"directory's name {name!r}"
        )
    return challenge


def is_path(name_or_path: str) -> bool:
    """Whether `name_or_path` names a file or directory rather than a built-in."""
    return "/" in name_or_path or name_or_path.endswith(".toml") or name_or_path in (".", "..")


def find_challenge(name_or_path: str) -> Challenge:
    """A challenge by name (built-in or an installed package's), or a challenge directory
    (or TOML file) by path (anything containing a `/` or ending in `.toml`). Raises
    `ChallengeError`."""
    if is_path(name_or_path):
        return load_challenge(name_or_path)
    return named_challenge(name_or_path)


def challenge_source(challenge: Challenge) -> str:
    """What finds `challenge` again (`find_challenge`): its name when it is the named
    challenge of that name (built-in or a package's; or was not loaded from disk), else
    the absolute path it came from."""
    if challenge.origin is None:
        return challenge.name
    named = CHALLENGES.get(challenge.name) if is_valid_name(challenge.name) else None
    if named is not None and challenge.origin == named.resolve():
        return challenge.name
    return str(challenge.origin)


async def place_challenge(challenge: Challenge, host: Host, seed: bytes) -> None:
    """Put what the challenge gives each host before its agent starts: its `files/` tree,
    then whatever its setup places (derived from `seed`). Raises the host's
    `OpsArenaError` (or `ChallengeError`)."""
    for placed in placed_files(challenge):
        await host.write_file(placed.path, placed.data, mode=placed.mode)
    await setup_of(challenge).place(host, seed)
