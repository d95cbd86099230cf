"""Reading challenge files, and the built-in challenges shipped inside the package.

`load_challenge(path)` validates a TOML file completely (structure, then check names)
and raises one `ChallengeError` whose `problems` has one line per problem, each naming
the file, the field and what is wrong. Built-in challenges live in `builtin/*.toml`.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opsarena.challenges.checks import check_names, load_checks_module, unknown_checks
from opsarena.challenges.model import (
    BUILTIN_CHECKS_MODULE,
    MODULE_PATTERN,
    Challenge,
    is_valid_name,
)
from opsarena.errors import ChallengeError

MAX_FILE_BYTES = 1024 * 1024
"""A challenge file larger than this is refused."""


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(file)"


def validation_problems(source: str, data: dict[str, Any]) -> tuple[Challenge | None, list[str]]:
    """Validate parsed TOML `data`; return the challenge (when valid) and one problem line
    per error, each `SOURCE: FIELD: what is wrong`. Pure apart from importing the
    challenge's checks module."""
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
    module = data.get("checks_module", BUILTIN_CHECKS_MODULE)
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
    challenge, problems = validation_problems(source, data)
    if challenge is None:
        summary = f"{source} is not a valid challenge ({len(problems)} problem(s)): " + "; ".join(
            p.removeprefix(f"{source}: ") for p in problems
        )
        raise ChallengeError(summary, problems)
    return challenge


def load_challenge(path: str | Path) -> Challenge:
    """Load and validate the challenge file at `path`. Raises `ChallengeError` when it is
    missing, unreadable, over `MAX_FILE_BYTES`, not TOML, or invalid."""
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ChallengeError(f"{file}: (file): {size} bytes is over the {MAX_FILE_BYTES} limit")
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChallengeError(f"{file}: (file): no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChallengeError(f"{file}: (file): cannot be read: {exc}") from None
    return parse_challenge(str(file), text)


def builtin_names() -> list[str]:
    """Names of the built-in challenges, sorted."""
    folder = resources.files("opsarena.challenges") / "builtin"
    return sorted(
        entry.name.removesuffix(".toml")
        for entry in folder.iterdir()
        if entry.name.endswith(".toml")
    )


def builtin_challenge(name: str) -> Challenge:
    """The built-in challenge `name`. Raises `ChallengeError` when there is none."""
    if not is_valid_name(name) or name not in builtin_names():
        raise ChallengeError(
            f"no built-in challenge named {name!r}: `opsarena challenges ls` lists them"
        )
    resource = resources.files("opsarena.challenges") / "builtin" / f"{name}.toml"
    return parse_challenge(f"builtin:{name}", resource.read_text(encoding="utf-8"))


def find_challenge(name_or_path: str) -> Challenge:
    """A built-in challenge by name, or a challenge file by path (anything containing a
    `/` or ending in `.toml`). Raises `ChallengeError`."""
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        return load_challenge(name_or_path)
    return builtin_challenge(name_or_path)
