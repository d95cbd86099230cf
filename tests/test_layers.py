"""The import layers of issue 24, read from the source: engine (hosts, store, ledger,
referee) -> workloads -> agents (the competitors; scripted builders install a workload's
server) -> challenges -> match/tournament -> cli/web/integrations. A module
imports only its own layer and those below it, so the engine never reaches up into a
workload or a challenge (a circle of imports could not then form either)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "opsarena"

ENGINE = ("hosts", "store", "ledger", "referee", "registry", "errors", "text")
ABOVE_ENGINE = (
    "workloads", "agents", "challenges", "match", "tournament", "cli", "web", "integrations",
)  # fmt: skip
ABOVE_WORKLOADS = ABOVE_ENGINE[1:]
ABOVE_AGENTS = ABOVE_ENGINE[2:]
ABOVE_CHALLENGES = ABOVE_ENGINE[3:]


def imported(path: Path) -> set[str]:
    """Every `opsarena...` module `path` imports (anywhere in the file)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "opsarena"}


def files(*packages: str) -> list[Path]:
    paths: list[Path] = []
    for package in packages:
        place = SRC / package
        paths += sorted(place.rglob("*.py")) if place.is_dir() else [place.with_suffix(".py")]
    return [p for p in paths if "/files/" not in p.as_posix()]


def reaching_up(paths: list[Path], above: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(SRC)} imports {name}"
        for path in paths
        for name in sorted(imported(path))
        if name.split(".")[1:2] and name.split(".")[1] in above
    ]


@pytest.mark.parametrize(
    ("layer", "paths", "above"),
    [
        ("engine", files(*ENGINE), ABOVE_ENGINE),
        ("workloads", files("workloads"), ABOVE_WORKLOADS),
        ("agents", files("agents"), ABOVE_AGENTS),
        ("built-in challenges", files("challenges/builtin"), ABOVE_CHALLENGES),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_no_import_runs_back_up(layer: str, paths: list[Path], above: tuple[str, ...]) -> None:
    assert paths, layer
    assert reaching_up(paths, above) == []


def test_built_in_checks_import_only_the_engine_and_workloads() -> None:
    """A challenge's checks judge through the engine and workloads; only its builders
    (competitors) use the agents' machinery."""
    allowed = (*ENGINE, "workloads")
    wrong = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in files("challenges/builtin")
        if path.name != "builders.py"
        for name in sorted(imported(path))
        if name.split(".")[1] not in allowed
    ]
    assert wrong == []
