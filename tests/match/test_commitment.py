"""The seed commitment: its documented preimage, and the fold's check of the reveal."""

from __future__ import annotations

import hashlib

import pytest

from opsarena.errors import EventLogError
from opsarena.match.commitment import reveal_problem, seed_commitment
from tests.match.simulated import DEMO_PLANS, NONCE, SEED, committed_events, fold_dicts


def test_the_commitment_is_sha256_of_the_documented_string() -> None:
    text = f"opsarena-seed-v1:m1:{NONCE.hex()}:{SEED.hex()}"
    assert seed_commitment("m1", NONCE, SEED) == hashlib.sha256(text.encode()).hexdigest()
    # Another match, nonce or seed gives another commitment.
    assert seed_commitment("m2", NONCE, SEED) != seed_commitment("m1", NONCE, SEED)
    assert seed_commitment("m1", bytes(16), SEED) != seed_commitment("m1", NONCE, SEED)


def test_a_reveal_opens_only_its_own_commitment() -> None:
    commitment = seed_commitment("m1", NONCE, SEED)
    assert reveal_problem("m1", commitment, SEED.hex(), NONCE.hex()) is None
    assert "does not match" in (reveal_problem("m1", commitment, "00" * 16, NONCE.hex()) or "")
    assert "does not match" in (reveal_problem("m2", commitment, SEED.hex(), NONCE.hex()) or "")
    assert "not lowercase hex" in (reveal_problem("m1", commitment, "xyz", NONCE.hex()) or "")
    assert "16 bytes" in (reveal_problem("m1", commitment, SEED.hex(), "ab") or "")


def test_the_record_has_the_commitment_while_running_and_the_seed_after_the_close() -> None:
    events = committed_events()
    running = fold_dicts(events[:-3])
    assert running.match_state != "finished"
    assert running.seed is None and running.seed_nonce is None
    assert running.seed_commitment == seed_commitment("demo1", NONCE, SEED)
    assert SEED.hex() not in running.model_dump_json()
    closed = fold_dicts(events)
    assert closed.match_state == "finished" and set(closed.territories) == set(DEMO_PLANS)
    assert (closed.seed, closed.seed_nonce) == (SEED.hex(), NONCE.hex())


@pytest.mark.parametrize(
    ("closing", "message"),
    [
        ({"seed": "00" * 16, "seed_nonce": NONCE.hex()}, "does not match the commitment"),
        ({}, "does not reveal the committed seed"),
    ],
)
def test_a_false_or_missing_reveal_cannot_be_folded(closing: dict[str, str], message: str) -> None:
    events = committed_events()
    events[-1]["data"] = closing
    with pytest.raises(EventLogError, match=message):
        fold_dicts(events)
