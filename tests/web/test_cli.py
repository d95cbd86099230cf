"""`opsarena serve` and `opsarena run --serve` as a user runs them (real processes, HTTP)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from opsarena.store import open_store
from tests.web.conftest import opsarena


def test_serve_refuses_a_busy_port_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    open_store(db).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = opsarena("serve", "--port", str(port), db=db, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "choose another --port" in done.stderr


def test_serve_refuses_a_file_that_is_not_an_event_log(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("not a database")
    done = opsarena("serve", "--port", "0", db=db, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "not an opsarena event log" in done.stderr


@pytest.mark.hosts
def test_run_serve_prints_the_url_serves_the_match_and_stops(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    command = [sys.executable, "-m", "opsarena.cli.main", "run", "--quiet", "--serve"]
    command += ["--db", str(db), "--builder", "a=scripted:reference"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "scoreboard: " in line:
                break
        found = re.search(r"scoreboard: (http://127\.0\.0\.1:\d+)/matches/(\S+)", "".join(lines))
        assert found, lines
        base, match_id = found.groups()
        # The match is running (or about to): its record is served while the process lives.
        answer = httpx.get(f"{base}/api/matches/{match_id}", timeout=30)
        assert answer.status_code == 200
        assert answer.json()["match_id"] == match_id
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/api/matches", timeout=5)
