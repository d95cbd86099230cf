"""The terminal view: what it draws from a record, and which events get a plain line."""

from __future__ import annotations

from rich.console import Console

from opsarena.cli.live import progress_line, render
from opsarena.store import StoredEvent
from tests.match.simulated import demo_events, fold_dicts


def test_live_frame_shows_every_territory_its_points_state_and_failure() -> None:
    record = fold_dicts(demo_events())
    console = Console(width=200, record=True, color_system=None)
    console.print(render(record))
    text = console.export_text()
    assert f"match {record.match_id}" in text and "winner:" in text
    legend = next(line for line in text.splitlines() if line.startswith("milestones: "))
    for name, territory in record.territories.items():
        line = next(line for line in text.splitlines() if line.startswith(f"│ {name} "))
        assert str(territory.milestone_points) in line
        assert territory.state in line
        for index, milestone in enumerate(territory.milestones, 1):
            assert f" {index} " in line and f"{index} {milestone}" in legend
        if territory.durable_at_ms is not None:
            assert territory.failure_reason is None or territory.failure_reason not in line
        elif territory.failure_reason:
            assert territory.failure_reason in line


def test_plain_progress_lines_for_notable_events_only() -> None:
    events = [StoredEvent(**e) if isinstance(e, dict) else e for e in demo_events()]
    lines = [progress_line(e) for e in events]
    said = [line for line in lines if line]
    assert any("match started" in line for line in said)
    assert any("passed (+" in line for line in said)
    assert any(line.startswith("[") and "finished:" in line for line in said)
    quiet_types = {"attempt_started", "agent_usage", "agent_transcript", "match_closed"}
    for event, line in zip(events, lines, strict=True):
        if event.type in quiet_types:
            assert line is None
