"""The fault rounds' traffic generator (`opsarena.workloads.records.workload.plan_traffic`): pure,
seeded, and with nothing fixed about where the fault comes or what comes before it."""

from __future__ import annotations

import collections

from opsarena.ledger import LedgerSummary, Slot
from opsarena.workloads.records.checks import (
    CONFIRM_MAX,
    CONFIRM_ROUNDS,
    FAULT_ROUNDS,
    rounds_needed,
)
from opsarena.workloads.records.workload import (
    DECOY_STEPS,
    FAULT_AFTER_MAX,
    REQUIRED_KINDS,
    TRAFFIC_ITEMS,
    TrafficPlan,
    plan_traffic,
    regenerate,
    slot_kind,
    slot_value,
    unwritten_id,
)

SEED = b"traffic-seed"


def plans(n: int, *, seed: bytes = SEED) -> list[TrafficPlan]:
    return [
        plan_traffic(seed, "t", "power-cut", 1 + i // 4, f"round-{i % 4 + 1}") for i in range(n)
    ]


def kinds_before_fault(plan: TrafficPlan) -> set[str]:
    """The required kinds PUT before the plan's fault_after-th PUT (included)."""
    seen: set[str] = set()
    for index, op in enumerate(plan.puts()):
        if index >= plan.fault_after:
            break
        assert op.slot is not None
        seen.add(slot_kind(op.slot.name).removesuffix("-1"))
    return seen & {*REQUIRED_KINDS, "text"}


def test_a_replay_sends_the_same_traffic_and_another_seed_does_not() -> None:
    assert plans(8) == plans(8)
    assert plans(8) != plans(8, seed=b"another")


def test_each_round_holds_every_required_kind_once_inside_its_traffic_never_first() -> None:
    text = Slot("t", "power-cut", 1, "text")
    for attempt in range(1, 40):
        plan = plan_traffic(SEED, "t", "power-cut", attempt, "round-1", text=text)
        if plan.fault_after == 0:
            continue
        assert len(plan.steps) >= TRAFFIC_ITEMS
        labels = collections.Counter(op.label for op in plan.puts())
        for kind in ("binary", "empty", "large", "text"):
            assert labels[kind] == 1, (kind, labels)
        assert labels["overwrite (second value)"] == 1
        assert plan.steps[0].ops[0].label not in ("binary", "empty", "large", "text")
        assert 1 <= plan.fault_after <= min(FAULT_AFTER_MAX, len(plan.puts()))


def test_the_fault_comes_early_and_late_and_sometimes_not_at_all() -> None:
    rounds = plans(800)
    decoys = [p for p in rounds if p.fault_after == 0]
    assert 0.05 < len(decoys) / len(rounds) < 0.15
    assert all(DECOY_STEPS[0] <= len(p.steps) <= DECOY_STEPS[1] for p in decoys)
    after = collections.Counter(p.fault_after for p in rounds if p.fault_after)
    assert after[1] == max(after.values())  # early most often ...
    assert max(after) >= 8  # ... and sometimes late
    # Whatever kind a cheater keys on, it comes before the fault in some rounds and not
    # in most: the kinds are inside the traffic, not at its start.
    for kind in ("binary", "empty", "large", "overwrite"):
        before = sum(kind in kinds_before_fault(p) for p in rounds if p.fault_after)
        assert 0 < before < len(rounds) / 4, kind


def test_about_half_the_fault_rounds_fall_silent_at_the_fault_whatever_comes_before() -> None:
    faulty = [p for p in plans(800) if p.fault_after]
    hushed = [p for p in faulty if p.hush]
    assert 0.4 < len(hushed) / len(faulty) < 0.6
    # Silence is not tied to where the fault comes: early and late faults both get it.
    assert {p.fault_after for p in hushed} == {p.fault_after for p in faulty}


def test_every_value_regenerates_from_its_slot_and_no_put_uses_a_never_written_id() -> None:
    plan = plans(1)[0]
    unwritten = {unwritten_id(SEED, "t", "power-cut", 1, i) for i in range(2000)}
    sizes = set()
    for op in plan.puts():
        assert op.slot is not None and op.id not in unwritten
        value = slot_value(SEED, op.slot)
        assert regenerate(SEED, op.slot) == value
        sizes.add(len(value))
        if slot_kind(op.slot.name).startswith("sized-"):
            assert len(value) == int(op.slot.name.split("-")[1])
    assert len(sizes) > 5  # random sizes, not one


def test_a_round_that_may_not_be_a_decoy_always_has_a_fault_and_a_forced_decoy_none() -> None:
    # An attempt past its decoys must get a fault round (else it would loop forever).
    for attempt in range(200):
        plan = plan_traffic(SEED, "t", "power-cut", attempt, "round-3", decoy=False)
        assert plan.fault_after >= 1
        assert (
            plan_traffic(SEED, "t", "write-read", attempt, "traffic", decoy=True).fault_after == 0
        )


def test_an_attempt_takes_two_samples_and_more_the_more_the_service_has_lost() -> None:
    assert rounds_needed(LedgerSummary(acknowledged=50, verified=50)) == FAULT_ROUNDS == 2
    once = rounds_needed(LedgerSummary(lost=1))
    assert once == CONFIRM_ROUNDS + 1
    assert rounds_needed(LedgerSummary(lost=2, stale=1)) > once
    assert rounds_needed(LedgerSummary(corrupted=500)) == CONFIRM_MAX
