"""Red team, `opsarena done`: only the territory's own token, or the operator key, ends a
person's session; every forged request written straight into the log is refused.

A real match (real hosts, the real controller and SQLite log) with two people and a
scripted competitor; requests are appended to the log as any process that can write it
would, with the proofs an attacker could make.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

import pytest

from opsarena.agents.competitors import competitor_from_cli
from opsarena.agents.human import HumanAgent, done_proof, operator_key
from opsarena.agents.registry import register_agent_kind
from opsarena.challenges.catalog import find_challenge
from opsarena.hosts import get_driver
from opsarena.match.controller import Controller, MatchPlan
from opsarena.match.events import DoneRequested
from opsarena.store import SqliteEventStore
from tests.conftest import new_match_id

pytestmark = pytest.mark.hosts

register_agent_kind(
    "test-person", lambda spec, settings, env: HumanAgent(), arg=None, done_token=True
)


async def test_only_the_territorys_token_or_the_operator_key_declares_it_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPSARENA_OPERATOR_KEY", str(tmp_path / "operator.key"))
    caplog.set_level(logging.WARNING, logger="opsarena.match.controller")
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[
            competitor_from_cli("alice", "human"),
            competitor_from_cli("bob", "test-person"),  # a plug-in kind with a done token
            competitor_from_cli("bot", "scripted:idle"),
        ],
        time_limit_s=180.0,
        match_id=new_match_id("done"),
        drain_s=1.0,
    )
    m = plan.match_id
    with SqliteEventStore(tmp_path / "log.db") as store:

        async def request(territory: str, proof: str, kind: str = "token") -> None:
            data = DoneRequested(territory=territory, by="mallory", proof=proof, proof_kind=kind)  # type: ignore[arg-type]
            await store.append(m, data.event_type, data.model_dump(mode="json"), 0)

        async def types() -> list[str]:
            return [e.type for e in await store.read(m)]

        def refusals(what: str) -> list[str]:
            lines = [r.getMessage() for r in caplog.records]
            return [line for line in lines if line == f"refused opsarena done for {what}"]

        match = asyncio.create_task(Controller(plan, store).run())
        try:
            deadline = time.monotonic() + 150
            while "match_started" not in await types():
                assert time.monotonic() < deadline and not match.done()
                await asyncio.sleep(0.2)
            # A refused request's line in the arena's log proves the controller follows
            # the log from here on (it reads only what comes after its start).
            while not refusals("bot: not a person's territory"):
                assert time.monotonic() < deadline and not match.done()
                await request("bot", "probe")
                await asyncio.sleep(0.2)
            alice, bob = plan.done_token("alice"), plan.done_token("bob")
            key = operator_key()
            assert key is not None, "the controller made the operator key"
            await request("bot", done_proof(key, m, "bot"), "operator")  # not a person's
            await request("alice", done_proof(bob, m, "alice"))  # another person's token
            await request("alice", done_proof(alice, m, "bob"))  # a proof for bob, as alice
            await request("alice", done_proof(alice, "other-match", "alice"))
            await request("alice", hashlib.sha256(alice.encode()).hexdigest())  # a hash is none
            await request("alice", done_proof("guess", m, "alice"), "operator")
            # Requests are answered in log order: the fifth refusal for alice is the last.
            while len(refusals("alice: the proof does not hold")) < 5:
                assert time.monotonic() < deadline and not match.done()
                await asyncio.sleep(0.05)
            assert "competitor_done" not in await types()
            await request("alice", done_proof(alice, m, "alice"))
            await request("bob", done_proof(key, m, "bob"), "operator")
            record = await asyncio.wait_for(match, 120)
        finally:
            if not match.done():
                match.cancel()
            await get_driver("podman").cleanup(match_id=m)
        events = await store.read(m)
    done = [e.data for e in events if e.type == "competitor_done"]
    assert done == [
        {"territory": "alice", "by": "mallory"},
        {"territory": "bob", "by": "mallory (operator)"},
    ]
    assert record.finish_reason == "all competitors finished"
    assert record.territories["bot"].done_by is None
    text = (tmp_path / "log.db").read_bytes()
    assert alice.encode() not in text and bob.encode() not in text and key.encode() not in text
