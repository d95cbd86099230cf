"""Red team: competitor text printed by the CLI cannot drive the operator's terminal.

Agent output, `terminal_detail` and names reach `opsarena show`, `ls`, `events` and the live
view. A string with ESC sequences (clear the screen, set the clipboard via OSC 52, colour)
or a bidi override must come out as visible escapes, never as the control bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsarena.cli.main import main
from opsarena.cli.output import printable
from opsarena.store import SqliteEventStore
from tests.match.simulated import Plan, simulate

ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b31m\u202egnp.exe"
TERRITORY = "t\x1b[8m"


def test_printable_shows_control_and_format_characters_as_escapes() -> None:
    assert printable("ok\ttab\nline é ✓") == "ok\ttab\nline é ✓"
    shown = printable(ESCAPES)
    assert shown == "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x9b31m\\u202egnp.exe"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)


def test_show_ls_and_events_print_no_control_byte_from_the_log(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    events = simulate("term1", {TERRITORY: Plan(passes=1, ends="failed"), "ref": Plan(passes=4)})
    with SqliteEventStore(db) as store:
        for event in events:
            data = event["data"]
            if event["type"] == "agent_ended":
                data["terminal_detail"] = ESCAPES
            if event["type"] == "agent_output":
                data["text"] = ESCAPES
            store.append_blocking("term1", event["type"], data, event["t_ms"], wall=event["wall"])
    env = {**os.environ, "OPSARENA_DB": str(db)}
    for args in (["show", "term1"], ["ls"], ["events", "term1"]):
        out = subprocess.run(
            [sys.executable, "-m", "opsarena.cli.main", *args],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x9b" not in out.stdout, args
        assert "\u202e" not in out.stdout, args
    shown = subprocess.run(
        [sys.executable, "-m", "opsarena.cli.main", "show", "term1"],
        capture_output=True, text=True, env=env, check=False,
    ).stdout  # fmt: skip
    assert "t\\x1b[8m" in shown and "\\x1b]52;c;" in shown


def test_an_error_quoting_others_text_prints_no_control_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fail` prints exception text, and others shape some of it (a D-Bus error body, the
    systemd state a readiness wait last saw, a path the operator was handed): an error
    quoting ESC sequences, a bidi override and a carriage return comes out as visible
    escapes, on one line. Here the path of a log that does not exist."""
    db = tmp_path / f"{ESCAPES}\rforged" / "log.db"
    with pytest.raises(SystemExit) as exited:
        main(["show", "m1", "--db", str(db)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in err), err
    assert "\u202e" not in err
    assert err.count("\n") == 1, err
    assert "\\x1b]52;c;" in err and "\\x0dforged" in err
