"""`opsarena serve` and `opsarena run --serve` as a user runs them (real processes, HTTP)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from opsarena.store import open_store
from tests.conftest import ArenaRuns
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
def test_run_serve_prints_the_url_serves_the_match_and_stops(
    arena_runs: ArenaRuns, tmp_path: Path
) -> None:
    db = tmp_path / "served.db"
    command = [sys.executable, "-m", "opsarena.cli.main", "run", "--quiet", "--serve"]
    command += ["--db", str(db), "--builder", "a=scripted:reference"]
    process = arena_runs.start(
        db, command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
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
        # While it runs the record shows the seed's commitment, never the seed.
        assert answer.json()["match_state"] != "finished"
        assert answer.json()["seed"] is None and len(answer.json()["seed_commitment"]) == 64
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/api/matches", timeout=5)


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as the kernel writes them) of TCP sockets listening on
    `port`, from /proc/net/tcp and tcp6: no traffic needed to see what is bound."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_serve_binds_loopback_only_by_default(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    open_store(db).close()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "opsarena.cli.main", "serve", "--port", "0", "--db", str(db)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        found: list[str] = []
        for _ in range(300):
            found = re.findall(r"http://([\d.]+):(\d+)/", (tmp_path / "serve.log").read_text())
            if found or server.poll() is not None:
                break
            time.sleep(0.1)
        assert found, (tmp_path / "serve.log").read_text()
        host, port = found[0]
        assert host == "127.0.0.1"
        assert listening_addresses(int(port)) == {"0100007F"}  # 127.0.0.1, nothing else
    finally:
        server.terminate()
        server.wait(10)
        log.close()
