"""Synthetic match logs: `simulate` writes the log a controller would write for a
scripted match (every territory plays a `Plan`). The fold tests judge it; the
seed-compatibility, CLI, web and store tests fill databases with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from opsarena.match.commitment import seed_commitment
from opsarena.match.events import parse_event
from opsarena.match.fold import fold_events
from opsarena.match.record import MatchRecord

MILESTONES = [("service-up", 10), ("write-read", 20), ("service-restart", 30), ("host-reboot", 40)]
WALL_ZERO = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

Envelope = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """How one territory plays: `passes` milestones pass in order, each after `fails[i]`
    failed attempts; `referee_errors` attempts of ours come first; the agent then ends
    (`completed`/`failed`) or keeps going until the drain terminates it (`idle`)."""

    passes: int
    fails: tuple[int, ...] = (0, 0, 0, 0, 1)
    referee_errors: int = 0
    ends: str = "idle"
    usage: tuple[tuple[int, int, int, int | None], ...] = ()
    reason: str = "connection_refused"


@dataclass
class Log:
    match_id: str
    t_ms: int = -800
    events: list[Envelope] = field(default_factory=list)

    def add(self, event_type: str, data: dict[str, Any], step: int = 37) -> None:
        self.t_ms += step
        wall = WALL_ZERO + timedelta(milliseconds=self.t_ms)
        self.events.append(
            {
                "match_id": self.match_id,
                "seq": len(self.events) + 1,
                "type": event_type,
                "t_ms": self.t_ms,
                "wall": wall.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "data": data,
            }
        )


def _steps(plan: Plan) -> list[tuple[str, int]]:
    steps: list[tuple[str, int]] = [("referee_error", 0)] * plan.referee_errors
    for index in range(plan.passes):
        steps += [("failed", index)] * plan.fails[index] + [("passed", index)]
    if plan.passes < len(MILESTONES):
        steps += [("failed", plan.passes)] * max(1, plan.fails[plan.passes])
    return steps


def simulate(
    match_id: str,
    plans: dict[str, Plan],
    *,
    finish_mode: str = "first-durable",
    keep_hosts: bool = False,
    time_limit_hit: bool = False,
) -> list[Envelope]:
    """The event log of a match played by `plans` (territory -> plan), closed at the end."""
    log = Log(match_id)
    log.add(
        "match_created",
        {
            "match_id": match_id,
            "challenge": "durable-records",
            "challenge_title": "Durable records service",
            "seed": "5eed" * 8,
            "finish_mode": finish_mode,
            "time_limit_s": 600,
            "drain_s": 5,
            "milestones": [{"id": mid, "points": points} for mid, points in MILESTONES],
            "territories": {
                name: {"agent": f"{name}-agent", "model": f"scripted:{name}", "kind": "scripted"}
                for name in plans
            },
        },
    )
    for name in plans:
        log.add("host_provisioning", {"territory": name})
    for name in plans:
        log.add("host_provisioned", {"territory": name, "host": f"h-{name}", "provision_ms": 900})
    for name in plans:
        log.add("preflight", {"territory": name, "ok": True, "detail": "service-up fails"})
    log.t_ms = -1
    log.add("match_started", {}, step=1)
    for name in plans:
        log.add("agent_started", {"agent": f"{name}-agent", "territory": name})
        for tokens_in, tokens_out, cached, cost in plans[name].usage:
            log.add(
                "agent_usage",
                {
                    "agent": f"{name}-agent",
                    "input_tokens": tokens_in,
                    "output_tokens": tokens_out,
                    "cached_tokens": cached,
                    "cost_microusd": cost,
                },
            )
        log.add("agent_output", {"agent": f"{name}-agent", "stream": "stdout", "text": "hi\n"})

    queues = {name: _steps(plan) for name, plan in plans.items()}
    attempts: dict[tuple[str, int], int] = {}
    points = dict.fromkeys(plans, 0)
    reached: dict[str, int] = {}
    ended: set[str] = set()
    durable: str | None = None
    while durable is None and any(queues.values()):
        for name, queue in queues.items():
            if not queue:
                continue
            verdict, index = queue.pop(0)
            milestone, worth = MILESTONES[index]
            attempt = attempts[name, index] = attempts.get((name, index), 0) + 1
            where = {"territory": name, "milestone": milestone, "attempt": attempt}
            log.add("attempt_started", where, step=250)
            if index >= 2 and verdict != "referee_error":
                fault = "restart" if index == 2 else "reboot"
                if fault == "reboot":
                    log.add("host_state", {"territory": name, "state": "rebooting"})
                log.add(
                    "fault_injected",
                    {**where, "fault": fault, "ok": True, "detail": "", "duration_ms": 800},
                )
                if fault == "reboot":
                    log.add("host_state", {"territory": name, "state": "ready"})
            failed = verdict != "passed"
            evidence = {"health": "ready"} if index == 0 else {"record": "record-1", "value": "v"}
            log.add(
                "attempt_result",
                {
                    **where,
                    "verdict": verdict,
                    "points": 0 if failed else worth,
                    "evidence": None if failed else evidence,
                    "failure_category": {
                        "failed": "verification_failed",
                        "referee_error": "referee_error",
                    }.get(verdict),
                    "failure_reason": None
                    if not failed
                    else ("podman_failed" if verdict == "referee_error" else plans[name].reason),
                    "failure_detail": None if not failed else f"connect: {verdict} after 3 ms",
                    "duration_ms": 12,
                },
            )
            if not failed:
                log.add("milestone_passed", {**where, "points": worth, "evidence": evidence})
                points[name] += worth
                reached[name] = log.t_ms
                if index == len(MILESTONES) - 1 and durable is None:
                    durable = name
            plan = plans[name]
            if plan.ends != "idle" and name not in ended:
                # The agent ends after its first move; the referee keeps verifying.
                log.add(
                    "agent_ended",
                    {
                        "agent": f"{name}-agent",
                        "terminal_state": plan.ends,
                        "successful": plan.ends == "completed",
                        "terminal_detail": f"the builder {plan.ends}",
                        "failure_source": None if plan.ends == "completed" else "player",
                    },
                )
                ended.add(name)
            elif name in ended and not failed:
                log.add("final_verification", {"territory": name, "changed": True})
            if name in ended and not queue:
                log.add("final_verification", {"territory": name, "changed": False})
        if finish_mode == "all" and any(queues.values()):
            durable = None
    if durable is not None and finish_mode == "first-durable":
        reason, winner = "first durable deployment", durable
    else:
        everyone_ended = ended == set(plans)
        reason = (
            "all competitors finished" if everyone_ended and not time_limit_hit else "time limit"
        )
        # As rules.winner: only a durable territory wins, the first to become durable.
        total = sum(p for _, p in MILESTONES)
        ranked = sorted((reached.get(n, 0), n) for n in plans if points[n] == total)
        winner = ranked[0][1] if ranked else None
    log.add("match_finished", {"finish_reason": reason, "winner": winner})
    for name in plans:
        if name not in ended:
            log.add(
                "agent_ended",
                {
                    "agent": f"{name}-agent",
                    "terminal_state": "terminated",
                    "successful": None,
                    "terminal_detail": "post-match drain deadline expired",
                    "failure_source": "controller",
                },
                step=1000,
            )
    for name in plans:
        log.add("host_state", {"territory": name, "state": "kept" if keep_hosts else "removed"})
    log.add("match_closed", {})
    return log.events


DEMO_PLANS = {
    "reference": Plan(passes=4, fails=(1, 0, 0, 0, 0), referee_errors=1, ends="completed"),
    "in-memory": Plan(passes=2, fails=(0, 0, 2, 0, 0), reason="record_missing"),
    "not-enabled": Plan(passes=3, fails=(0, 0, 0, 3, 0), reason="not_ready_after_fault"),
    "idle": Plan(passes=0, fails=(4, 0, 0, 0, 0), usage=((1200, 300, 100, 450), (10, 5, 0, None))),
}


def demo_events(match_id: str = "demo1") -> list[Envelope]:
    """The demo match: reference wins by first durable deployment."""
    return simulate(match_id, DEMO_PLANS)


def fold_dicts(events: list[Envelope]) -> MatchRecord:
    return fold_events(parse_event(event) for event in events)


plan_strategy = st.builds(
    Plan,
    passes=st.integers(0, 4),
    fails=st.tuples(*[st.integers(0, 2)] * 5),
    referee_errors=st.integers(0, 2),
    ends=st.sampled_from(["idle", "completed", "failed"]),
    usage=st.lists(
        st.tuples(
            st.integers(0, 5000),
            st.integers(0, 500),
            st.integers(0, 100),
            st.one_of(st.none(), st.integers(0, 10_000)),
        ),
        max_size=3,
    ).map(tuple),
    reason=st.sampled_from(["connection_refused", "wrong_body", "timeout"]),
)
match_strategy = st.builds(
    simulate,
    match_id=st.just("prop"),
    plans=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), plan_strategy, min_size=1, max_size=4
    ),
    finish_mode=st.sampled_from(["first-durable", "all"]),
    keep_hosts=st.booleans(),
    time_limit_hit=st.booleans(),
)


SEED = bytes.fromhex("5eed" * 8)
NONCE = bytes(range(16))


def committed_events(match_id: str = "demo1") -> list[dict[str, Any]]:
    """The demo log as a controller writes it now: the commitment at the start, the seed
    and nonce revealed by `match_closed`."""
    events = demo_events(match_id)
    created = events[0]["data"]
    del created["seed"]
    created["seed_commitment"] = seed_commitment(match_id, NONCE, SEED)
    assert events[-1]["type"] == "match_closed"
    events[-1]["data"] = {"seed": SEED.hex(), "seed_nonce": NONCE.hex()}
    return events
