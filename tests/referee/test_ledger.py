"""The workload, the ledger and the back-off rule, as pure functions."""

from __future__ import annotations

import hashlib

import pytest

from opsarena.ledger import (
    REREAD_MAX_BYTES,
    REREAD_MAX_RECORDS,
    Entry,
    Ledger,
    LedgerUpdate,
    Pending,
    Slot,
    classify,
)
from opsarena.referee.referee import BACKOFF_CAP_S, retry_delay
from opsarena.workloads.records.workload import (
    LARGE_BYTES,
    first_difference,
    plan_attempt,
    regenerate,
    slot_value,
)

SEED = b"ledger-seed"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_plan_is_the_seed_s_and_covers_the_contract() -> None:
    plan = plan_attempt(SEED, "t", "write-read", 3)
    assert plan == plan_attempt(SEED, "t", "write-read", 3)  # a replay writes the same bytes
    assert plan != plan_attempt(b"other-seed", "t", "write-read", 3)
    assert plan.text.value.startswith(b"opaque-") and len(plan.text.value) == 39
    assert sorted(plan.binary.value) == list(range(256))
    assert plan.binary.value != bytes(range(256))  # a seeded order, not the identity
    assert plan.empty.value == b"" and len(plan.large.value) == LARGE_BYTES
    first, second = plan.overwrite
    assert first.id == second.id and first.value != second.value
    assert len({r.id for r in plan.parallel}) == 8 and len({r.value for r in plan.parallel}) == 8
    assert len({r.id for r in plan.same_id}) == 1 and len({r.value for r in plan.same_id}) == 4
    written = {r.id for r in plan.written()}
    assert not written & set(plan.unwritten)
    for record in plan.written():
        assert regenerate(SEED, record.slot) == record.value


def test_first_difference() -> None:
    assert first_difference(b"abc", b"abc") is None
    assert first_difference(b"abc", b"abd") == 2
    assert first_difference(b"abc", b"ab") == 2
    assert first_difference(b"", b"x") == 0


def entry(*values: bytes, older: tuple[bytes, ...] = (), absent_ok: bool = False) -> Entry:
    slots = [Slot("t", "m", 1, "text") for _ in values]
    return Entry("record-1", [sha(v) for v in values], slots, [len(v) for v in values],
                 older=[sha(o) for o in older], absent_ok=absent_ok)  # fmt: skip


def test_classify_each_outcome() -> None:
    e = entry(b"new", older=(b"old",))
    assert classify(e, 200, sha(b"new")) == "ok"
    assert classify(e, 200, sha(b"old")) == "stale"
    assert classify(e, 200, sha(b"other")) == "corrupted"
    assert classify(e, 404, None) == "lost"
    assert classify(e, 500, None) is None
    assert classify(entry(b"maybe", absent_ok=True), 404, None) == "ok"


def write_update(pending: Pending) -> LedgerUpdate:
    return pending.update()


def test_apply_overwrite_concurrent_indeterminate_and_drop() -> None:
    ledger = Ledger()
    p = Pending("t", "write-read", 1)
    slot = Slot("t", "write-read", 1, "x")
    p.write("a", b"v1", slot, acknowledged=True)
    p.write("a", b"v2", slot, acknowledged=True)  # an overwrite
    p.write("b", b"s1", slot, acknowledged=True, concurrent=True)
    p.write("b", b"s2", slot, acknowledged=True, concurrent=True)
    p.write("c", b"lost?", slot, acknowledged=False)  # no answer came
    ledger.apply(p.update())
    a, b, c = (ledger.entries[i] for i in "abc")
    assert (a.accepted, a.older) == ([sha(b"v2")], [sha(b"v1")])
    assert b.accepted == [sha(b"s1"), sha(b"s2")]
    assert c.absent_ok and classify(c, 404, None) == "ok"
    assert ledger.summary.acknowledged == 4 and ledger.summary.indeterminate == 1

    check = Pending("t", "service-restart", 1)
    check.count("ok", "b")
    check.count("lost", "a")
    check.count("unexpected")
    ledger.apply(check.update())
    assert "a" not in ledger.entries and "b" in ledger.entries
    s = ledger.summary
    assert (s.verified, s.lost, s.unexpected, s.records) == (1, 1, 1, 2)


def test_a_read_settles_concurrent_writes_and_forgiven_records_are_dropped() -> None:
    ledger = Ledger()
    p = Pending("t", "write-read", 1, ledger)
    slot = Slot("t", "write-read", 1, "same-id-0")
    for value in (b"s1", b"s2", b"s3"):
        p.write("b", value, slot, acknowledged=True, concurrent=True)
    p.settle("b", sha(b"s2"))  # the same-id GET read s2: from now on only s2 is right
    b = ledger.entries["b"]
    assert b.accepted == [sha(b"s2")] and set(b.older) == {sha(b"s1"), sha(b"s3")}
    assert classify(b, 200, sha(b"s1")) == "stale"
    folded = Ledger()
    folded.apply(LedgerUpdate.model_validate(p.update().model_dump(mode="json")))
    assert folded.entries["b"].accepted == [sha(b"s2")]
    assert classify(folded.entries["b"], 200, sha(b"s3")) == "stale"

    check = Pending("t", "disk-loss", 1)
    check.forgive("b")
    folded.apply(check.update())
    assert "b" not in folded.entries
    assert (folded.summary.forgiven, folded.summary.lost) == (1, 0)


def test_a_live_ledger_and_a_folded_one_agree() -> None:
    live = Ledger()
    p = Pending("t", "write-read", 1, live)
    p.write("a", b"v", Slot("t", "write-read", 1, "text"), acknowledged=True)
    assert "a" in live.entries  # taken in at once, for re-reads in the same attempt
    p.count("corrupted", "a")
    update = p.update()
    live.apply(update, writes=False)
    folded = Ledger()
    folded.apply(LedgerUpdate.model_validate(update.model_dump(mode="json")))
    assert live.summary == folded.summary and live.entries.keys() == folded.entries.keys()


def test_the_reread_sample_is_bounded_and_deterministic() -> None:
    ledger = Ledger()
    p = Pending("t", "write-read", 1)
    for i in range(REREAD_MAX_RECORDS + 40):
        p.write(f"r{i}", b"x%d" % i, Slot("t", "write-read", 1, f"s{i}"), acknowledged=True)
    ledger.apply(p.update())
    small = ledger.sample(SEED, "t", "k", {"r3"})
    assert len(small) == REREAD_MAX_RECORDS and "r3" in {e.id for e in small}
    assert [e.id for e in small] == [e.id for e in ledger.sample(SEED, "t", "k", {"r3"})]
    assert [e.id for e in small] != [e.id for e in ledger.sample(SEED, "t", "k2", {"r3"})]

    big = Ledger()
    p = Pending("t", "write-read", 1)
    for i in range(40):
        big_slot = Slot("t", "write-read", i, "large")
        p.write(f"L{i}", slot_value(SEED, big_slot), big_slot, acknowledged=True)
    big.apply(p.update())
    chosen = big.sample(SEED, "t", "k", {"L0"})
    assert sum(e.size for e in chosen) <= REREAD_MAX_BYTES and "L0" in {e.id for e in chosen}
    assert len(chosen) == REREAD_MAX_BYTES // LARGE_BYTES


@pytest.mark.parametrize(
    ("failures", "fault", "delay"),
    [(1, True, 1.0), (2, True, 1.0), (3, True, 2.0), (4, True, 4.0), (5, True, BACKOFF_CAP_S),
     (50, True, BACKOFF_CAP_S), (50, False, 1.0)],
)  # fmt: skip
def test_back_off_rule(failures: int, fault: bool, delay: float) -> None:
    assert retry_delay(1.0, failures, fault=fault) == delay


def test_back_off_never_goes_below_the_cadence() -> None:
    assert retry_delay(10.0, 9, fault=True) == 10.0
