"""The referee on real hosts: the run loop, its events, preflight, faults and our errors."""

from __future__ import annotations

import asyncio
import re
import time
from importlib import resources

import pytest

from opsarena.agents.base import AgentContext
from opsarena.agents.scripted import get_scripted
from opsarena.challenges import Challenge
from opsarena.hosts import Host, HostDriver
from opsarena.ledger import LedgerUpdate
from opsarena.referee.feedback import feedback_message
from opsarena.workloads.records.derive import derive_record
from opsarena.workloads.records.workload import plan_traffic
from tests.conftest import HostFactory
from tests.referee.conftest import EventLog, make_referee

# The data of each referee event, exactly as the event vocabulary lists it.
VOCABULARY = {
    "attempt_started": {"territory", "milestone", "attempt"},
    "attempt_result": {
        "territory", "milestone", "attempt", "verdict", "points", "evidence",
        "failure_category", "failure_reason", "failure_detail", "duration_ms",
    },
    "milestone_passed": {"territory", "milestone", "points", "evidence", "attempt"},
    "fault_injected": {"territory", "milestone", "attempt", "fault", "ok", "detail", "duration_ms"},
    "host_state": {"territory", "state"},
    "ledger_update": {
        "territory", "milestone", "attempt", "writes", "checked", "dropped", "settled"
    },
}  # fmt: skip


async def deploy(builder: str, host: Host, challenge: Challenge, match_id: str) -> None:
    context = AgentContext(
        match_id=match_id, territory=host.territory, brief=challenge.brief, host=host,
        deadline=time.monotonic() + 120, params={"port": challenge.port, "unit": challenge.unit},
    )  # fmt: skip
    await get_scripted(builder, challenge.directory).run(context)


@pytest.mark.hosts
async def test_run_judges_territories_concurrently_until_durable(
    challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    durable_host = await host_factory("good")
    idle_host = await host_factory("idle")
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("good", durable_host)
    referee.add_territory("idle", idle_host)
    await deploy("reference", durable_host, challenge, match_id)

    running = asyncio.create_task(referee.run())
    async with asyncio.timeout(90):
        await referee.any_durable.wait()
        # The durable path can be quicker than one cadence: let the idle territory be
        # judged a second time before stopping, so its retry at the cadence is observed.
        while len(idle_attempts(log)) < 2:
            await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    for kind, data in log.events:
        assert set(data) == VOCABULARY[kind], (kind, data)
    assert referee.durable_order == ["good"]
    assert referee.points("good") == 100 and referee.is_durable("good")
    assert referee.durable_at_ms("good") is not None
    assert referee.points("idle") == 0 and not referee.is_durable("idle")
    assert referee.infrastructure_failures == 0

    good = [(k, d) for k, d in log.events if d["territory"] == "good"]
    kinds = [k for k, _ in good]
    # Two fault rounds per attempt: two faults (each reboot between its host states).
    assert kinds == [
        "attempt_started", "attempt_result", "milestone_passed",
        "attempt_started", "ledger_update", "attempt_result", "milestone_passed",
        "attempt_started", "fault_injected", "fault_injected", "ledger_update",
        "attempt_result", "milestone_passed",
        "attempt_started", "host_state", "fault_injected", "host_state",
        "host_state", "fault_injected", "host_state", "ledger_update",
        "attempt_result", "milestone_passed",
    ]  # fmt: skip
    updates = [d for k, d in good if k == "ledger_update"]
    # write-read acknowledged its 18 PUTs (4 pairs, 2 overwrite, 8 parallel, 4 same-id)
    # and verified its 15 reads (14 ids), then its traffic stretch (seeded: every PUT of
    # it acknowledged, every read of a written or older record verified). Each fault
    # round's traffic PUTs fresh records (each an id of its own, the overwrite's two
    # PUTs one id) until the fault, then the whole ledger is re-read.
    tail = plan_traffic(b"calibration-seed", "good", "write-read", 1, "traffic", decoy=True)
    reads = sum(op.kind in ("get", "old") for step in tail.steps for op in step.ops)
    writes = [len(u["writes"]) for u in updates]
    assert writes[0] == 18 + len(tail.puts()) and all(w >= 2 for w in writes[1:])
    reread = passed_reread(good)
    assert len(reread) == 2 and reread[0] < reread[1]  # type: ignore[operator]
    verified = [u["checked"]["verified"] for u in updates]
    assert verified[0] == 15 + reads
    assert all(v >= r for v, r in zip(verified[1:], reread, strict=True))  # type: ignore[operator]
    assert all(not u["dropped"] for u in updates)
    # What `opsarena resume` does: a new referee rebuilds the same ledger from the events.
    rebuilt = make_referee(challenge, EventLog())
    rebuilt.add_territory("good", durable_host)
    rebuilt.restore_ledger("good", [LedgerUpdate.model_validate(u) for u in updates])
    assert rebuilt.ledger_summary("good") == referee.ledger_summary("good")
    assert rebuilt.ledger_summary("good").records == reread[-1]
    passed = {d["milestone"]: d["evidence"] for k, d in good if k == "milestone_passed"}
    assert passed["service-up"]["health"] == "ready"
    record, value = derive_record(b"calibration-seed", "good", "write-read", 1)
    assert (passed["write-read"]["record"], passed["write-read"]["value"]) == (record, value)
    assert passed["service-restart"]["restart"] is True
    assert passed["host-reboot"]["reboot"] is True
    states = [d["state"] for k, d in good if k == "host_state"]
    assert states == ["rebooting", "ready"] * 2
    assert durable_host.boots == 3

    # The idle territory was judged all along at the cadence, each attempt a fresh one.
    idle_results = idle_attempts(log)
    assert len(idle_results) >= 2
    assert [d["attempt"] for d in idle_results] == list(range(1, len(idle_results) + 1))
    assert {d["failure_reason"] for d in idle_results} == {"connection_refused"}
    message = feedback_message(idle_results[0])
    assert message.startswith("service-up failed: connection_refused — GET /health")

    # Final verification of a competitor that did nothing changes nothing.
    assert await referee.verify("idle") is False


def idle_attempts(log: EventLog) -> list[dict[str, object]]:
    return [d for k, d in log.events if k == "attempt_result" and d["territory"] == "idle"]


def passed_reread(events: list[tuple[str, dict[str, object]]]) -> list[object]:
    return [
        d["evidence"]["reread"]
        for k, d in events  # type: ignore[index]
        if k == "milestone_passed" and "reread" in (d["evidence"] or {})
    ]  # type: ignore[operator]


@pytest.mark.hosts
async def test_verify_runs_every_remaining_milestone(
    challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    host = await host_factory("late")
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("late", host)
    first = await referee.evaluate_next("late")
    assert first is not None and first.failure_reason == "connection_refused"
    await deploy("reference", host, challenge, match_id)
    assert await referee.verify("late") is True
    assert referee.is_durable("late")
    assert referee.milestone_state("late", "service-up").attempts == 2


@pytest.mark.hosts
async def test_preflight_refuses_a_host_that_already_passes(
    challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    host = await host_factory("solved")
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("solved", host)
    await deploy("reference", host, challenge, match_id)
    result = await referee.preflight("solved")
    assert not result.ok
    assert "already passes service-up" in result.detail
    assert "is broken" in result.detail
    assert log.events == []  # a preflight never emits, never scores
    assert referee.points("solved") == 0


async def start_records_server_outside_the_unit(host: Host) -> None:
    script = resources.files("opsarena.workloads.records").joinpath("server.py")
    await host.write_file("/opt/elsewhere/records_server.py", script.read_bytes())
    started = await host.exec(
        ["systemd-run", "--unit=elsewhere", "/usr/bin/python3", "/opt/elsewhere/records_server.py",
         "--port", "8080", "--storage", "/var/lib/elsewhere"],
        timeout=30,
    )  # fmt: skip
    assert started.ok, started.stderr


@pytest.mark.hosts
async def test_a_server_outside_the_named_unit_is_not_credited(
    challenge: Challenge, host_factory: HostFactory
) -> None:
    host = await host_factory("stray")
    await start_records_server_outside_the_unit(host)
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("stray", host)
    for _ in range(50):  # until the stray server listens
        up = await referee.evaluate_next("stray")
        if up is not None and up.failure_reason not in ("connection_refused", None):
            break
        await asyncio.sleep(0.1)
    # A server that answers but is not the named unit does not even pass service-up:
    # the referee asks who owns the port (referee/ownership.py).
    assert up is not None and up.failure_reason == "unit_missing"
    assert "builder-app.service" in (up.failure_detail or "")

    unit = "[Service]\nExecStart=/usr/bin/sleep infinity\n"
    await host.write_file("/etc/systemd/system/builder-app.service", unit.encode())
    await host.exec(["systemctl", "daemon-reload"], timeout=30)
    not_owned = await referee.evaluate_next("stray")
    assert not_owned is not None and not_owned.failure_reason == "port_not_owned_by_unit"
    assert referee.infrastructure_failures == 0


@pytest.mark.hosts
async def test_a_lost_host_is_our_error_counted_and_retried(
    challenge: Challenge, host_factory: HostFactory, podman_driver: HostDriver, match_id: str
) -> None:
    host = await host_factory("lost")
    await deploy("reference", host, challenge, match_id)
    log = EventLog()
    referee = make_referee(challenge, log)
    referee.add_territory("lost", host)
    up = await referee.evaluate_next("lost")
    assert up is not None and up.outcome == "passed"

    await podman_driver.remove(host.name)
    for attempt in (1, 2):
        verdict = await referee.evaluate_next("lost")
        assert verdict is not None and verdict.outcome == "referee_error"
        assert verdict.failure_category == "referee_error"
        assert verdict.failure_reason == "host_unavailable"
        assert referee.milestone_state("lost", "write-read").attempts == attempt
    assert referee.infrastructure_failures == 2
    assert referee.points("lost") == 10  # nothing awarded, nothing taken away
    results = log.of("attempt_result")
    assert [r["verdict"] for r in results] == ["passed", "referee_error", "referee_error"]
    assert all(r["points"] == 0 for r in results[1:])
    assert "not your fault" in feedback_message(results[1])


@pytest.mark.hosts
async def test_a_failing_fault_backs_off_and_lost_records_are_dropped_but_counted(
    challenge: Challenge, host_factory: HostFactory, match_id: str
) -> None:
    host = await host_factory("forgetful")
    referee = make_referee(challenge, EventLog())
    referee.add_territory("forgetful", host)
    await deploy("in-memory", host, challenge, match_id)
    details = []
    while len(details) < 4:
        verdict = await referee.evaluate_next("forgetful")
        assert verdict is not None and verdict.outcome != "referee_error", verdict
        if verdict.outcome == "failed":
            assert verdict.failure_reason == "record_missing"
            details.append(verdict.failure_detail or "")
    state = referee.milestone_state("forgetful", "service-restart")
    assert not any("back-off" in d for d in details[:2])
    assert details[2].endswith(
        "failed 3 times in a row: the next attempt starts 2 s after this one started (back-off)"
    )
    assert "starts 4 s after" in details[3] and state.next_delay_s == 4.0
    # The first restart lost the 14 records of write-read and the round's own acknowledged
    # before the fault (at least one: the fault comes after the j-th); each later one only
    # its own fresh records: every lost record was dropped, and counted.
    first = re.search(r"the ledger re-read (\d+) of (\d+) records: (\d+) lost", details[0])
    assert first is not None and first[1] == first[2] and int(first[3]) >= 14 + 1
    later = re.search(r"the ledger re-read (\d+) of (\d+) records: (\d+) lost", details[1])
    assert later is not None and int(later[3]) >= 1
    summary = referee.ledger_summary("forgetful")
    assert summary.lost >= 14 + 4
    # Only records whose PUT was never answered before the restart (indeterminate, and
    # rightly absent) stay in the ledger.
    assert summary.records <= summary.indeterminate
