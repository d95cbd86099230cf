"""Schemathesis against the scoreboard's OpenAPI schema: every GET, with generated values,
answers as its schema says (status codes, content types, bodies), on a real match's log."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.case import Case

from opsarena.web import create_app
from tests.web.conftest import Played

pytestmark = pytest.mark.hosts


OPERATIONS = [
    "GET /api/matches",
    "GET /api/matches/{match_id}",
    "GET /api/matches/{match_id}/events",
    "GET /api/matches/{match_id}/stream",
    "GET /api/tournaments/{tournament_id}",
    "GET /api/tournaments/{tournament_id}/stream",
]
"""Every GET but `/api/stream`, which never ends by design (its first message is tested in
test_api). The match stream answers 404 for generated ids and closes for a finished match;
the tournament routes answer 404 here (this log has no tournament; tests/tournament plays
real ones)."""


@pytest.mark.parametrize("operation", OPERATIONS)
def test_api_conforms_to_its_schema(played: Played, operation: str) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(played.db))
    operations = {}
    for result in schema.get_all_operations():
        loaded = result.ok()  # type: ignore[union-attr]  # an Err would raise here, loudly
        operations[f"{loaded.method.upper()} {loaded.path}"] = loaded
    assert set(operations) == {*OPERATIONS, "GET /api/stream"}
    found = operations[operation]

    @given(case=found.as_strategy())
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def conforms(case: Case[Any]) -> None:
        case.call_and_validate()

    conforms()
