"""The human agent waits for `opsarena done` (ctx.done) or the deadline; it never touches the
host, so it gets a real one that nobody uses."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import pytest

from opsarena.agents import AgentContext
from opsarena.agents.human import (
    HumanAgent,
    done_proof,
    done_token,
    human_instructions,
    operator_key,
    proof_holds,
)
from opsarena.hosts import Host

pytestmark = pytest.mark.hosts


def make_ctx(host: Host, deadline_s: float) -> AgentContext:
    return AgentContext(
        match_id="m3",
        territory="builder-three",
        brief="b",
        host=host,
        deadline=time.monotonic() + deadline_s,
    )


async def test_done_declared_by_a_person_completes_the_agent(agents_host: Host) -> None:
    ctx = make_ctx(agents_host, 300)
    task = asyncio.create_task(HumanAgent().run(ctx))
    await asyncio.sleep(0)
    assert not task.done()
    ctx.params["done_by"] = "alice"
    ctx.done.set()
    outcome = await task
    assert (outcome.terminal_state, outcome.successful) == ("completed", True)
    assert outcome.terminal_detail == "declared done by alice"


async def test_the_deadline_ends_the_wait(agents_host: Host) -> None:
    outcome = await HumanAgent().run(make_ctx(agents_host, 0.2))
    assert (outcome.terminal_state, outcome.successful) == ("terminated", None)
    assert outcome.failure_source == "controller"
    assert outcome.terminal_detail == "time ran out before the person declared done"


async def test_cancellation_stops_the_wait(agents_host: Host) -> None:
    task = asyncio.create_task(HumanAgent().run(make_ctx(agents_host, 300)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_instructions_give_the_exact_commands() -> None:
    assert human_instructions("m3", "builder-three", "tok") == (
        "builder-three: work in your host with `opsarena hosts shell m3/builder-three`; "
        "when finished run `OPSARENA_DONE_TOKEN=tok opsarena done m3 builder-three` "
        "(the token is yours alone: it ends your session)"
    )


def test_each_territory_and_match_has_its_own_token_and_proof() -> None:
    key = b"k" * 32
    token = done_token(key, "m3", "one")
    assert len(token) == 24 and token == done_token(key, "m3", "one")
    others = {
        done_token(key, "m3", "two"),
        done_token(key, "m4", "one"),
        done_token(b"x", "m3", "one"),
    }
    assert token not in others and len(others) == 3
    proof = done_proof(token, "m3", "one")
    assert token not in proof
    assert proof_holds(proof, token, "m3", "one")
    assert not proof_holds(proof, token, "m3", "two"), "a proof is for one territory"
    assert not proof_holds(proof, token, "m4", "one"), "and one match"
    assert not proof_holds(done_proof("guess", "m3", "one"), token, "m3", "one")
    assert not proof_holds(None, token, "m3", "one")


def test_the_operator_key_is_made_once_readable_only_by_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys" / "operator.key"
    monkeypatch.setenv("OPSARENA_OPERATOR_KEY", str(path))
    assert operator_key() is None, "never made by a reader"
    key = operator_key(create=True)
    assert key is not None and len(key) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert operator_key(create=True) == key == operator_key()
