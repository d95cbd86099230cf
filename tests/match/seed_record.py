"""Whether a record keeps every key path of the seed record, with the same JSON types
(`incompatibilities`).

`key_paths` maps each key path of a JSON document to the set of JSON types found there.
The names under `territories`, `agents` and `milestones` are data, not keys, so they become
`*`; `evidence` is free-form per milestone (the referee decides its keys), so it is compared
as one value and not descended into.

Where the seed has `null` at a path, we accept what the seed itself accepts there: null, or
the type that path takes in the seed's other entries (`durable_at_ms` is null in two
territories and an integer in the third; `successful` is null and true). Three paths are
null in every seed entry (`last_health`, `elimination_source`, `elimination_detail`): the
seed never shows their type, so `SEED_NULL_ONLY` says which type ours has (all strings,
documented in docs/MATCHES.md) and nothing else is accepted there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opsarena.match.record import MatchRecord

SEED = Path(__file__).parent.parent / "data" / "seed-match-record.json"
"""A copy of shared/seed/match-record.json: the record whose every key path ours keeps."""
NAMED = {"territories", "agents", "milestones"}
OPAQUE = {"evidence"}
SEED_NULL_ONLY = {
    "territories.*.last_health": {"string"},
    "territories.*.elimination_source": {"string"},
    "territories.*.elimination_detail": {"string"},
}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def key_paths(document: Any, prefix: str = "") -> dict[str, set[str]]:
    """Every key path below `document` and the JSON types seen there."""
    paths: dict[str, set[str]] = {}
    if not isinstance(document, dict):
        return paths
    parent = prefix.rsplit(".", 1)[-1]
    for key, value in document.items():
        name = "*" if parent in NAMED else key
        path = f"{prefix}.{name}" if prefix else name
        paths.setdefault(path, set()).add(json_type(value))
        if isinstance(value, dict) and name not in OPAQUE:
            for sub, types in key_paths(value, path).items():
                paths.setdefault(sub, set()).update(types)
    return paths


def missing_keys(document: Any, seed: dict[str, set[str]], prefix: str = "") -> set[str]:
    """`PATH: missing` for each seed key path absent from any one of our objects there
    (each territory, agent and milestone must have all of its keys, not just one of them)."""
    if not isinstance(document, dict):
        return set()
    parent = prefix.rsplit(".", 1)[-1]
    missing = set()
    expected = {
        path.rsplit(".", 1)[-1]
        for path in seed
        if (path.rsplit(".", 1)[0] if "." in path else "") == prefix
    }
    if parent not in NAMED:
        missing |= {f"{prefix}.{key}".lstrip(".") + ": missing" for key in expected - set(document)}
    for key, value in document.items():
        name = "*" if parent in NAMED else key
        if name not in OPAQUE:
            missing |= missing_keys(value, seed, f"{prefix}.{name}" if prefix else name)
    return missing


def allowed_types(seed: dict[str, set[str]]) -> dict[str, set[str]]:
    allowed = {}
    for path, types in seed.items():
        allowed[path] = types | SEED_NULL_ONLY.get(path, set()) if types == {"null"} else types
    return allowed


def incompatibilities(record: MatchRecord | dict[str, Any]) -> list[str]:
    """Every seed key path our record lacks or holds with a type the seed does not allow."""
    seed = allowed_types(key_paths(json.loads(SEED.read_text())))
    document = record if isinstance(record, dict) else json.loads(record.model_dump_json())
    ours = key_paths(document)
    if document.get("winner", "") is None and document.get("finish_reason") is not None:
        # "No winner if nobody scored" (issue 4): a case the seed, which has a winner, lacks.
        seed["winner"] = seed["winner"] | {"null"}
    problems = sorted(missing_keys(document, seed))
    for path, types in sorted(seed.items()):
        if path in ours and not ours[path] <= types:
            problems.append(f"{path}: ours {sorted(ours[path])}, seed allows {sorted(types)}")
    return problems
