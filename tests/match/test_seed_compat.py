"""Our record keeps every key path of the seed record, with the same JSON types (how
they are compared: `tests/match/seed_record.py`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings

from tests.match.seed_record import (
    SEED,
    SEED_NULL_ONLY,
    incompatibilities,
    key_paths,
)
from tests.match.simulated import DEMO_PLANS, Plan, fold_dicts, match_strategy, simulate


def test_key_paths_sees_the_seed_as_it_is() -> None:
    seed = key_paths(json.loads(SEED.read_text()))
    assert seed["territories.*.durable_at_ms"] == {"integer", "null"}
    assert seed["territories.*.class"] == {"string"}
    assert seed["territories.*.milestones.*.evidence"] == {"object", "null"}
    assert seed["agents.*.successful"] == {"boolean", "null"}
    assert "territories.*.milestones.*.evidence.health" not in seed
    assert {p for p, t in seed.items() if t == {"null"}} == set(SEED_NULL_ONLY)
    assert len(seed) == 39


def test_the_demo_record_has_every_seed_key_path_with_its_type() -> None:
    record = fold_dicts(simulate("seedcompat", DEMO_PLANS))
    assert incompatibilities(record) == []


@pytest.mark.parametrize(
    "plans",
    [
        {"a": Plan(passes=0), "b": Plan(passes=1, ends="failed")},
        {"solo": Plan(passes=4, referee_errors=2, ends="completed")},
    ],
)
def test_other_finished_matches_are_seed_compatible(plans: dict[str, Plan]) -> None:
    assert incompatibilities(fold_dicts(simulate("seedcompat", plans))) == []


def test_a_changed_type_is_caught() -> None:
    record = json.loads(fold_dicts(simulate("seedcompat", DEMO_PLANS)).model_dump_json())
    record["territories"]["idle"]["resources"] = "one"
    del record["agents"]["idle-agent"]["cost_microusd"]
    assert incompatibilities(record) == [
        "agents.*.cost_microusd: missing",
        "territories.*.resources: ours ['integer', 'string'], seed allows ['integer']",
    ]


@settings(max_examples=100, deadline=None)
@given(events=match_strategy)
def test_every_finished_match_is_seed_compatible(events: list[dict[str, Any]]) -> None:
    assert incompatibilities(fold_dicts(events)) == []
