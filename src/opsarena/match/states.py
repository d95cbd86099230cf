"""The match's state machines as data: the match, a territory's host, a competitor.

Each machine is a table `state -> {input: next state}`; `StateMachine.step` is the only way
a state changes, and an input the table does not list for the current state is impossible
(`EventLogError`). docs/MATCHES.md shows each table as a diagram made by `mermaid()`; a test
keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opsarena.errors import EventLogError


@dataclass(frozen=True)
class StateMachine:
    """A finite state machine: `initial`, the transition table, and the states a closed
    match may leave it in (`final`)."""

    name: str
    initial: str
    transitions: Mapping[str, Mapping[str, str]]
    final: frozenset[str]

    def step(self, state: str, given: str) -> str:
        """The state after input `given` in `state`; raises `EventLogError` when the table
        has no such transition."""
        following = self.transitions.get(state, {}).get(given)
        if following is None:
            allowed = ", ".join(sorted(self.transitions.get(state, {}))) or "nothing"
            raise EventLogError(
                f"{self.name} cannot go from {state!r} on {given!r} (allowed: {allowed})"
            )
        return following

    def states(self) -> list[str]:
        """Every state, in the order the table first names it."""
        seen: dict[str, None] = {self.initial: None}
        for state, moves in self.transitions.items():
            seen.setdefault(state, None)
            for target in moves.values():
                seen.setdefault(target, None)
        return list(seen)


MATCH = StateMachine(
    name="match_state",
    initial="created",
    transitions={
        "created": {"provision": "provisioning", "finish": "finishing"},
        "provisioning": {"provision": "provisioning", "start": "running", "finish": "finishing"},
        "running": {"finish": "finishing"},
        "finishing": {"close": "finished"},
        "finished": {},
    },
    final=frozenset({"finished"}),
)
"""`provision` = host_provisioning, `start` = match_started, `finish` = match_finished (the
winner is decided; agents drain), `close` = match_closed (drained, hosts removed or kept)."""


TERRITORY = StateMachine(
    name="territory state",
    initial="pending",
    transitions={
        "pending": {"provisioning": "provisioning", "close": "not-provisioned"},
        "provisioning": {"provisioned": "ready", "failed": "failed", "removed": "removed"},
        "ready": {
            "ready": "ready",
            "rebooting": "rebooting",
            "lost": "lost",
            "removed": "removed",
            "kept": "kept",
        },
        "rebooting": {"ready": "ready", "lost": "lost", "removed": "removed", "kept": "kept"},
        "failed": {"removed": "removed", "close": "failed"},
        "lost": {
            "ready": "ready",
            "rebooting": "rebooting",
            "lost": "lost",
            "provisioning": "provisioning",
            "removed": "removed",
            "kept": "kept",
            "close": "lost",
        },
        "removed": {"removed": "removed", "close": "removed"},
        "kept": {"kept": "kept", "close": "kept"},
        "not-provisioned": {},
    },
    final=frozenset({"not-provisioned", "failed", "lost", "removed", "kept"}),
)
"""The host's lifecycle. Inputs: `provisioning` / `provisioned` / `failed` from the host_*
events, `ready` / `rebooting` / `lost` / `removed` / `kept` from host_state, and `close`
(match_closed), which only a host that is no longer running accepts: a match cannot close
with a host still `ready`, the seed's defect."""


COMPETITOR = StateMachine(
    name="competitor_state",
    initial="waiting",
    transitions={
        "waiting": {"start": "building", "eliminate": "eliminated", "unscored": "no-score"},
        "building": {
            "durable": "durable",
            "stopped": "verifying",
            "eliminate": "eliminated",
            "scored": "scored",
            "unscored": "no-score",
        },
        "verifying": {
            "durable": "durable",
            "stopped": "verifying",
            "changed": "verifying",
            "unchanged": "settled",
            "eliminate": "eliminated",
            "scored": "scored",
            "unscored": "no-score",
        },
        "settled": {
            "durable": "durable",
            "stopped": "settled",
            "changed": "verifying",
            "unchanged": "settled",
            "eliminate": "eliminated",
            "scored": "scored",
            "unscored": "no-score",
        },
        "durable": {
            "stopped": "durable",
            "changed": "durable",
            "unchanged": "durable",
            "eliminate": "durable",
            "scored": "durable",
            "unscored": "durable",
        },
        "eliminated": {
            "stopped": "eliminated",
            "eliminate": "eliminated",
            "scored": "eliminated",
            "unscored": "eliminated",
        },
        "scored": {"stopped": "scored", "eliminate": "scored"},
        "no-score": {"stopped": "no-score", "eliminate": "no-score"},
    },
    final=frozenset({"durable", "eliminated", "scored", "no-score"}),
)
"""The competitor's standing. `start` = match_started; `durable` = its last milestone passed;
`stopped` = its agent ended or a person ran `opsarena done`; `changed` / `unchanged` = a
final verification pass; `eliminate` = its host could not be provisioned; `scored` / `unscored` =
match_finished, by whether it has milestone points. After match_finished only agents ending
and hosts failing can still happen, and they no longer change the standing."""


MACHINES: tuple[StateMachine, ...] = (MATCH, TERRITORY, COMPETITOR)


def mermaid(machine: StateMachine) -> str:
    """The machine as a mermaid `stateDiagram-v2` (the diagrams in docs/MATCHES.md)."""
    lines = ["stateDiagram-v2"]
    lines += [
        f'    state "{state}" as {_node(state)}' for state in machine.states() if "-" in state
    ]
    lines.append(f"    [*] --> {_node(machine.initial)}")
    for state, moves in machine.transitions.items():
        targets: dict[str, list[str]] = {}
        for given, target in moves.items():
            targets.setdefault(target, []).append(given)
        for target, inputs in targets.items():
            lines.append(f"    {_node(state)} --> {_node(target)}: {', '.join(inputs)}")
    for state in machine.states():
        if state in machine.final:
            lines.append(f"    {_node(state)} --> [*]")
    return "\n".join(lines)


def _node(state: str) -> str:
    return state.replace("-", "_")
