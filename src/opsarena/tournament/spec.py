"""Tournament files: what they may say, their validation, and the schedule they make.

    name = "scripted-ci"              # optional, shown in listings
    seed = "00112233445566778899aabbccddeeff"   # optional hex; random when absent
    challenges = "all"                # or a list of names / challenge files
    trials = 5                        # matches per challenge (per group)
    group_size = 0                    # 0: everyone in every match; N >= 2: every N-subset
    parallel = 2                      # matches at once (the machine may allow fewer)
    retries = 1                       # replays of a match voided by the arena

    [match]                           # per-match limits
    time_limit_s = 120
    drain_s = 2
    finish = "all"                    # or "first-durable"
    disk_quota_mb = 2048
    disk_inode_quota = 100000

    [llm] / [prices."x"] / [territories.NAME]   # exactly as in a competitors file

Every problem is reported, one line each (`FILE: FIELD: what is wrong`), in one
`TournamentError`; nothing is made before the whole file is valid.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import re
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsarena.agents.competitors import Competitor, check_competitors
from opsarena.challenges.catalog import builtin_names, find_challenge
from opsarena.errors import ChallengeError, CompetitorsFileError, TournamentError
from opsarena.match.controller import DEFAULT_INODE_QUOTA
from opsarena.referee.model import Challenge

SEED_RE = re.compile(r"^(?:[0-9a-fA-F]{2}){8,64}$")
MAX_MATCHES = 10_000
"""The most matches one tournament may schedule: a typo in `trials` should not queue a
month of work."""


class MatchLimits(BaseModel):
    """The `[match]` table: the limits every match of the tournament is played with."""

    model_config = ConfigDict(extra="forbid")

    time_limit_s: float | None = Field(default=None, ge=1, le=24 * 3600)
    drain_s: float = Field(default=2.0, ge=0, le=600)
    finish: Literal["all", "first-durable"] = "all"
    disk_quota_mb: int = Field(default=2048, ge=64)
    disk_inode_quota: int = Field(default=DEFAULT_INODE_QUOTA, ge=1000)


class TournamentFile(BaseModel):
    """The tournament's own keys; `llm`, `prices` and `territories` go to the
    competitors-file checker."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=80)
    seed: str | None = None
    challenges: Literal["all"] | list[str] = Field(default="all")
    trials: int = Field(default=5, ge=1, le=1000)
    group_size: int = Field(default=0, ge=0)
    parallel: int = Field(default=1, ge=1, le=64)
    retries: int = Field(default=1, ge=0, le=5)
    match: MatchLimits = MatchLimits()
    llm: dict[str, Any] = Field(default_factory=dict)
    prices: dict[str, Any] = Field(default_factory=dict)
    territories: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Slot:
    """One scheduled match: its place in the schedule, challenge, trial and players."""

    slot: int
    challenge: str
    trial: int
    group: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "challenge": self.challenge,
            "trial": self.trial,
            "group": list(self.group),
        }


@dataclass(frozen=True)
class TournamentPlan:
    """A valid tournament file: competitors by name, challenges by name, the schedule."""

    source: str
    text: str
    name: str
    seed: bytes
    competitors: dict[str, Competitor]
    challenges: dict[str, Challenge]
    trials: int
    group_size: int
    parallel: int
    retries: int
    limits: MatchLimits
    slots: tuple[Slot, ...]

    @property
    def territories_per_match(self) -> int:
        return max(len(slot.group) for slot in self.slots)


def load_tournament(path: str | Path) -> TournamentPlan:
    """Read and check the tournament file at `path`. Raises `TournamentError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TournamentError(f"tournament file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TournamentError(f"cannot read tournament file {path}: {exc}") from None
    return parse_tournament(text, str(path), base=path.parent)


def parse_tournament(
    text: str, source: str, *, base: Path | None = None, seed: bytes | None = None
) -> TournamentPlan:
    """Check a tournament file's `text`; challenge files are relative to `base`. `seed`
    (a resumed tournament's) wins over the file's. Raises `TournamentError`."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TournamentError(f"{source}: not valid TOML: {exc}") from None
    try:
        parsed = TournamentFile.model_validate(raw)
    except ValidationError as exc:
        raise TournamentError(
            "\n".join(f"{source}: {_where(e['loc'])}: {_what(e)}" for e in exc.errors())
        ) from None
    problems: list[str] = []
    competitors: dict[str, Competitor] = {}
    if not parsed.territories:
        problems.append(f"{source}: territories: a tournament needs at least two competitors")
    else:
        try:
            loaded = check_competitors(
                {"llm": parsed.llm, "prices": parsed.prices, "territories": parsed.territories},
                source,
            )
            competitors = {c.territory: c for c in loaded.competitors}
        except CompetitorsFileError as exc:
            problems += str(exc).splitlines()
        if len(parsed.territories) < 2:
            problems.append(f"{source}: territories: a tournament needs at least two competitors")
    if parsed.group_size == 1 or parsed.group_size > max(len(parsed.territories), 2):
        problems.append(
            f"{source}: group_size: must be 0 (everyone in every match) or between 2 and the "
            f"{len(parsed.territories)} competitors (got {parsed.group_size})"
        )
    if parsed.seed is not None and not SEED_RE.match(parsed.seed):
        problems.append(f"{source}: seed: must be an even number (16-128) of hex digits")
    challenges: dict[str, Challenge] = {}
    names = builtin_names() if parsed.challenges == "all" else parsed.challenges
    if not names:
        problems.append(f"{source}: challenges: the list is empty")
    for index, given in enumerate(names):
        where = "challenges" if parsed.challenges == "all" else f"challenges.{index}"
        target = given
        if base is not None and ("/" in given or given.endswith(".toml")):
            target = str((base / given) if not Path(given).is_absolute() else Path(given))
        try:
            challenge = find_challenge(target)
        except ChallengeError as exc:
            problems += [f"{source}: {where}: {line}" for line in exc.problems]
            continue
        if challenge.name in challenges:
            problems.append(f"{source}: {where}: challenge {challenge.name!r} is given twice")
        challenges[challenge.name] = challenge
    if problems:
        raise TournamentError("\n".join(problems))
    slots = schedule(list(challenges), list(competitors), parsed.trials, parsed.group_size)
    if len(slots) > MAX_MATCHES:
        raise TournamentError(
            f"{source}: trials: the schedule has {len(slots)} matches, more than {MAX_MATCHES}"
        )
    chosen_seed = seed or (bytes.fromhex(parsed.seed) if parsed.seed else secrets.token_bytes(16))
    return TournamentPlan(
        source=source,
        text=text,
        name=parsed.name,
        seed=chosen_seed,
        competitors=competitors,
        challenges=challenges,
        trials=parsed.trials,
        group_size=parsed.group_size,
        parallel=parsed.parallel,
        retries=parsed.retries,
        limits=parsed.match,
        slots=tuple(slots),
    )


def schedule(
    challenges: list[str], competitors: list[str], trials: int, group_size: int
) -> list[Slot]:
    """The matches of a tournament, in the order they are played: trial by trial (so a
    tournament stopped early has even coverage), then challenge, then group. With
    `group_size` 0 every match has every competitor; otherwise every `group_size`-subset
    plays each challenge once per trial (round robin for 2)."""
    if group_size == 0 or group_size >= len(competitors):
        groups = [tuple(competitors)]
    else:
        groups = list(itertools.combinations(competitors, group_size))
    slots: list[Slot] = []
    for trial in range(1, trials + 1):
        for challenge in challenges:
            for group in groups:
                slots.append(Slot(len(slots) + 1, challenge, trial, group))
    return slots


def match_seed(tournament_seed: bytes, slot: Slot, attempt: int) -> bytes:
    """The seed of one attempt at one slot: HMAC-SHA256 of the tournament seed over the
    slot's identity, cut to 16 bytes. A replay (attempt 2, ...) gets a seed of its own."""
    message = f"opsarena-match|{slot.slot}|{attempt}|{slot.challenge}|{slot.trial}|"
    message += ",".join(slot.group)
    return hmac.new(tournament_seed, message.encode(), hashlib.sha256).digest()[:16]


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _what(error: Any) -> str:
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    value = error.get("input")
    if error.get("type") != "missing" and not isinstance(value, dict):
        message += f" (got {value!r})"
    return message
