"""Red team, competitor programs: a hostile command agent tries every way out of its cage.

Each attack is planted exactly as a hostile program would run it: a script given to a
`CommandAgent`, on real hosts, with only what a competitor is given. Each test then
checks, from outside, that nothing happened: no file in a neighbour's host, no request
through another agent's gate, nothing read from the arena, no signal received, no
secret in the program's environment, no process outside its cgroup, no network.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from opsarena.agents import AgentContext
from opsarena.agents.cage import DEFAULT_LIMITS, SCRATCH_BYTES
from opsarena.agents.command import GATE_BUDGET, CommandAgent
from opsarena.hosts import Host
from tests.agents.contexts import Events, cmdline, recording_context, script
from tests.conftest import SharedHosts

pytestmark = pytest.mark.hosts

CHECKOUT = Path(__file__).resolve().parents[2]
ALLOWED_ENV = {
    "PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_", "OLDPWD",
    "OPSARENA_BRIEF_FILE", "OPSARENA_MATCH", "OPSARENA_TERRITORY",
    "OPSARENA_EXEC", "OPSARENA_PUT",
}  # fmt: skip
"""The documented environment (docs/AGENTS.md), plus what bash itself sets."""


def context(host: Host) -> tuple[AgentContext, Events]:
    return recording_context(host, match_id="redteam", territory=host.territory)


def stream(events: Events, name: str) -> str:
    return "".join(d["text"] for k, d in events if k == "output" and d["stream"] == name)


def transcript(events: Events) -> list[dict[str, object]]:
    """The results the gate recorded (each after its `*_request` entry)."""
    return [
        d["entry"]
        for k, d in events
        if k == "transcript" and not str(d["entry"]["kind"]).endswith("_request")
    ]


async def run_attack(
    host: Host, tmp_path: Path, body: str, **options: object
) -> tuple[str, str, Events]:
    program = script(tmp_path / "attack.sh", body)
    ctx, events = context(host)
    agent = CommandAgent([str(program)], **{"grace_s": 0.5, "wall_s": 60, **options})  # type: ignore[arg-type]
    outcome = await agent.run(ctx)
    assert outcome.terminal_state in ("completed", "failed"), outcome
    return stream(events, "stdout"), stream(events, "stderr"), events


async def test_podman_and_nsenter_into_a_neighbours_host_fail(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    attacker, neighbour = await shared_hosts("attacker"), await shared_hosts("neighbour")
    out, _err, _ = await run_attack(
        attacker,
        tmp_path,
        f"""
        #!/bin/bash
        podman exec {neighbour.name} touch /tmp/pwned-by-podman; echo "podman $?"
        podman --remote exec {neighbour.name} touch /tmp/pwned-by-podman; echo "remote $?"
        runc --root /run/runc exec {neighbour.name} touch /tmp/pwned; echo "runc $?"
        nsenter -t 1 -m -p touch /tmp/pwned-by-nsenter; echo "nsenter $?"
        echo "sockets: $(find / -path /proc -prune -o -type s -print 2>/dev/null | tr '\\n' ' ')"
        ls /var/lib/containers /run/podman /run/containers 2>&1 | head -3
        """,
    )
    for tool in ("podman", "remote", "runc", "nsenter"):
        assert re.search(rf"^{tool} [1-9]", out, re.M), out
    assert "sockets: /opsarena/gate/gate.sock \n" in out, "its own gate is the only socket"
    for name in ("pwned-by-podman", "pwned", "pwned-by-nsenter"):
        found = await neighbour.exec(f"test -e /tmp/{name}", timeout=30)
        assert found.exit_code == 1, name
        assert not Path(f"/tmp/{name}").exists(), f"{name} landed on the arena machine"


async def test_another_agents_gate_cannot_be_used(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    victim_host, attacker_host = await shared_hosts("victim"), await shared_hosts("attacker")
    victim_program = script(tmp_path / "victim.sh", "#!/bin/sh\nsleep 120\n")
    victim = CommandAgent([str(victim_program)], grace_s=0.2)
    victim_ctx, victim_events = context(victim_host)
    victim_run = asyncio.create_task(victim.run(victim_ctx))
    try:
        view = await victim_view(victim)
        gate = view / "gate" / "gate.sock"
        token = re.search(r"gate\.sock (\S+) ", (view / "exec").read_text())
        assert token, (view / "exec").read_text()
        # From inside another agent: every way to the victim's gate it could know of.
        (tmp_path / "a").mkdir()
        out, _err, attacker_events = await run_attack(
            attacker_host,
            tmp_path / "a",
            f"""
            #!/bin/bash
            ls -d /tmp/opsarena-agent-* 2>&1; echo "listing $?"
            found=$(find / -path /proc -prune -o -name gate.sock -print 2>/dev/null)
            for sock in {gate} $found; do
              python3 -I -S /opsarena/shim.py exec "$sock" {token[1]} 'touch /tmp/pwned'
              echo "gate $sock $?"
            done
            """,
        )
        assert re.search(rf"^gate {re.escape(str(gate))} 255$", out, re.M), out
        # Its own gate refuses the victim's token: a token belongs to one uid.
        assert re.search(r"^gate /opsarena/gate/gate.sock 2$", out, re.M), out
        assert transcript(attacker_events) == []
        # From the arena machine itself, at the real path: root, and the victim's uid
        # with a wrong token, are refused; the victim's uid with its token gets through.
        assert victim.uid is not None
        refused = (2, "this gate belongs to another agent")
        assert await asyncio.to_thread(knock, gate, token[1], uid=0) == refused
        assert await asyncio.to_thread(knock, gate, "wrong", uid=victim.uid) == refused
        assert transcript(victim_events) == [], "refused requests are nobody's actions"
        assert await asyncio.to_thread(knock, gate, token[1], uid=victim.uid) == (0, "")
        assert [e["command"] for e in transcript(victim_events)] == ["true"]
        found = await victim_host.exec("test -e /tmp/pwned", timeout=30)
        assert found.exit_code == 1
    finally:
        victim_run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim_run


async def victim_view(agent: CommandAgent) -> Path:
    """The arena-side path of `agent`'s view, read from its sandbox's command line."""
    for _ in range(200):
        for pid in agent.cage.pids() if agent.cage is not None else []:
            words = cmdline(pid).split(b"\0")
            if b"/opsarena" in words:
                return Path(words[words.index(b"/opsarena") - 1].decode())
        await asyncio.sleep(0.05)
    raise AssertionError("the agent's sandbox never started")


def knock(gate: Path, token: str, *, uid: int) -> tuple[int, str]:
    """Ask `gate` to run `true` as `uid` presenting `token` (with the shim's code, from the
    gate's own directory, so no parent directory needs to be searchable): (exit code,
    error)."""
    shim = (gate.parent.parent / "shim.py").read_text()
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", shim, "exec", "gate.sock", token, "true"],
        cwd=gate.parent, user=uid, group=uid if uid else None, capture_output=True,
        text=True, timeout=30, check=False,
    )  # fmt: skip
    error = done.stderr.removeprefix("opsarena: ").strip()
    return done.returncode, error


async def test_the_event_log_the_checkout_and_the_arenas_processes_are_out_of_sight(
    shared_hosts: SharedHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = await shared_hosts("attacker")
    exposed = tmp_path / "exposed"
    exposed.mkdir(mode=0o755)
    exposed.chmod(0o755)
    db = exposed / "opsarena.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE events (data TEXT)")
        conn.execute("INSERT INTO events VALUES ('secret-row-4711')")
    db.chmod(0o666)
    monkeypatch.setenv("OPSARENA_DB", str(db))
    out, _err, _ = await run_attack(
        host,
        tmp_path,
        f"""
        #!/bin/bash
        cat {db} | strings | grep -c secret-row; echo "db $?"
        echo 'INSERT INTO events VALUES (1)' >> {db}; echo "write $?"
        cat {CHECKOUT / "pyproject.toml"}; echo "checkout $?"
        ls {CHECKOUT}; echo "ls $?"
        cat /proc/{os.getpid()}/environ; echo "environ $?"
        for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done | grep -c pytest
        echo "procs $(ls -d /proc/[0-9]* | wc -l)"
        ls /sys/fs/cgroup 2>&1; echo "sys $?"
        """,
    )
    for what in ("db", "write", "checkout", "ls", "environ", "sys"):
        assert re.search(rf"^{what} [1-9]", out, re.M), (what, out)
    assert "secret-row" not in out and "[project]" not in out
    assert re.search(r"^0$", out, re.M), "no process of the arena (pytest) is visible"
    procs = int(re.findall(r"^procs (\d+)", out, re.M)[0])
    assert procs < 10, "only the program's own processes are in its /proc"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (1,)


async def test_signals_to_the_controller_never_arrive(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    received: list[int] = []
    marks: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signo, _frame: received.append(signo))
    previous_mark = signal.signal(signal.SIGUSR2, lambda signo, _frame: marks.append(signo))
    try:
        out, _err, _ = await run_attack(
            host,
            tmp_path,
            f"""
            #!/bin/bash
            kill -0 {os.getpid()}; echo "probe $?"
            kill -USR1 {os.getpid()}; echo "usr1 $?"
            kill -STOP 1; echo "init $?"
            trap '' USR1
            kill -USR1 -1; echo "all $?"
            """,
        )
        # raise_signal runs the handlers of every signal already arrived before it returns,
        # lower numbers first: SIGUSR1's, had the attack's come, then this mark's.
        signal.raise_signal(signal.SIGUSR2)
        assert marks == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.signal(signal.SIGUSR2, previous_mark)
    assert received == []
    for what in ("probe", "usr1", "init"):
        assert re.search(rf"^{what} [1-9]", out, re.M), (what, out)


async def test_no_key_and_no_event_log_in_the_programs_environment(
    shared_hosts: SharedHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = await shared_hosts("attacker")
    secrets = {
        "OPENAI_API_KEY": "sk-fake-openai-2718",
        "OPENROUTER_API_KEY": "sk-or-fake-3141",
        "OPSARENA_DB": str(tmp_path / "arena.db"),
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    out, _err, _ = await run_attack(
        host,
        tmp_path,
        """
        #!/bin/bash
        env
        cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'
        """,
    )
    for value in secrets.values():
        assert value not in out
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert names <= ALLOWED_ENV, names - ALLOWED_ENV
    assert {"OPSARENA_EXEC", "OPSARENA_PUT", "OPSARENA_BRIEF_FILE"} <= names


async def test_the_program_cannot_leave_its_cgroup(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    program = script(
        tmp_path / "escape.sh",
        """
        #!/bin/bash
        for f in /sys/fs/cgroup/pids/cgroup.procs /sys/fs/cgroup/cgroup.procs \\
                 /sys/fs/cgroup/unified/cgroup.procs; do
          echo $$ > "$f"; echo "move $?"
        done
        mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg; echo "mount $?"
        unshare -Urm true; echo "userns $?"
        setsid sleep 997 &
        sleep 30
        """,
    )
    agent = CommandAgent([str(program)], grace_s=0.2, wall_s=60)
    ctx, events = context(host)
    running = asyncio.create_task(agent.run(ctx))
    sleepers: list[int] = []
    for _ in range(200):
        await asyncio.sleep(0.05)
        sleepers = [p for p in (agent.cage.pids() if agent.cage else []) if b"997" in cmdline(p)]
        if sleepers and "userns " in stream(events, "stdout"):
            break
    assert sleepers and agent.cage is not None
    membership = Path(f"/proc/{sleepers[0]}/cgroup").read_text()
    for controller in ("pids", "memory", "cpu"):
        line = next(x for x in membership.splitlines() if f":{controller}:" in x)
        assert agent.cage.name in line, (controller, line)
    cage_path = agent.cage.path
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    out = stream(events, "stdout")
    assert out.count("move ") == 3 and "move 0" not in out, out
    assert re.search(r"^mount [1-9]", out, re.M) and re.search(r"^userns [1-9]", out, re.M)
    assert not Path(f"/proc/{sleepers[0]}").exists() or b"997" not in cmdline(sleepers[0])
    assert not cage_path.exists()


async def test_network_is_off_unless_the_competitor_opted_in(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    connections: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(await reader.readline())
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    body = f"""
        #!/bin/bash
        python3 -c 'import socket
        s = socket.create_connection(("127.0.0.1", {port}), 3)
        s.sendall(b"hello\\n")'
        echo "connect $?"
        echo "links $(ls /sys/class/net 2>/dev/null | wc -l) $(grep -c : /proc/net/dev)"
        """
    try:
        (tmp_path / "off").mkdir()
        out, _err, _ = await run_attack(host, tmp_path / "off", body)
        assert re.search(r"^connect [1-9]", out, re.M), out
        assert "links 0 1" in out, "no /sys, and only lo in /proc/net/dev"
        assert connections == []
        (tmp_path / "on").mkdir()
        out, _err, _ = await run_attack(host, tmp_path / "on", body, network=True)
        assert re.search(r"^connect 0$", out, re.M), out
        assert connections == [b"hello\n"]
    finally:
        server.close()
        await server.wait_closed()


async def test_filling_tmp_and_home_stops_at_their_size(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    out, _err, _ = await run_attack(
        host,
        tmp_path,
        """
        #!/bin/bash
        for dir in /tmp "$HOME" /dev/shm; do
          head -c 600M /dev/zero > "$dir/fill"; echo "fill $dir $?"
          echo "size $dir $(stat -c %s "$dir/fill" 2>/dev/null || echo 0)"
          rm -f "$dir/fill"
        done
        """,
    )
    sizes = {d: int(n) for d, n in re.findall(r"^size (\S+) (\d+)$", out, re.M)}
    assert set(sizes) == {"/tmp", "/home/agent", "/dev/shm"}, out  # /dev/shm: not writable
    for directory, size in sizes.items():
        assert size <= SCRATCH_BYTES or size <= DEFAULT_LIMITS.memory_bytes, (directory, size)
        assert size < 600 * 1024 * 1024, directory
    assert re.search(r"^fill /tmp [1-9]", out, re.M) and re.search(
        r"^fill /home/agent [1-9]", out, re.M
    )


async def test_malformed_requests_to_its_own_gate_are_refused_one_by_one(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    out, _err, events = await run_attack(
        host,
        tmp_path,
        """
        #!/bin/bash
        token=$(grep -o 'gate.sock [^ ]*' /opsarena/exec | cut -d' ' -f2)
        python3 - "$token" <<'PY'
        import json, socket, sys
        token = sys.argv[1]
        def ask(raw):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect("/opsarena/gate/gate.sock")
                try:
                    s.sendall(raw)
                    s.shutdown(socket.SHUT_WR)
                    data = b"".join(iter(lambda: s.recv(65536), b""))
                except OSError as exc:
                    return f"dropped {exc.errno}"
            return json.loads(data)["exit_code"] if data else "closed"
        base = {"op": "exec", "command": "touch /tmp/bad", "token": token}
        for name, raw in [
            ("nan", json.dumps({**base, "timeout": float("nan")}).encode() + b"\\n"),
            ("negative", json.dumps({**base, "timeout": -5}).encode() + b"\\n"),
            ("list", b"[1, 2]\\n"),
            ("junk", b"\\x00\\xff not json\\n"),
            ("huge", b"x" * (5 << 20) + b"\\n"),
            ("no-token", json.dumps({"op": "exec", "command": "touch /tmp/bad"}).encode() + b"\\n"),
        ]:
            print(name, ask(raw), flush=True)
        PY
        $OPSARENA_EXEC 'echo still-serving'
        """,
    )
    answers = dict(re.findall(r"^(\S+) (\S+(?: \d+)?)$", out, re.M))
    for name in ("nan", "negative", "list", "junk", "no-token"):
        assert answers.get(name) == "2", (name, out)
    assert answers.get("huge") in ("2", "closed") or answers.get("huge", "").startswith("dropped")
    assert out.rstrip().endswith("still-serving"), out
    assert [e["command"] for e in transcript(events)] == ["echo still-serving"]
    assert (await host.exec("test -e /tmp/bad", timeout=30)).exit_code == 1


def rss_mib(field: str) -> float:
    """This process's resident memory (`VmRSS`) or its peak since the last reset
    (`VmHWM`), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


async def test_flooding_its_gate_with_huge_requests_holds_bounded_arena_memory(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    """Red team (the gate is the arena's memory): 8 request lines of 132 MiB at once (an
    exec whose standard input is 99 MiB of base64, the largest line the gate once took:
    the arena held ~1.5 GB), then 6 execs announcing 100 MiB of raw standard input each,
    straight to the socket. The arena process's peak grows by less than the gate's
    budget plus a margin; the documented interface still carries a 100 MiB file intact,
    and refuses a standard input over 100 MiB with a line saying so."""
    host = await shared_hosts("attacker")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = rss_mib("VmRSS")
    out, err, events = await run_attack(
        host,
        tmp_path,
        """
        #!/bin/bash
        token=$(grep -o 'gate.sock [^ ]*' /opsarena/exec | cut -d' ' -f2)
        python3 - "$token" <<'PY'
        import json, socket, sys, threading
        token, chunk = sys.argv[1], b"A" * (1 << 20)
        head = {"op": "exec", "command": "cat >/dev/null", "token": token, "timeout": 60}
        def flood(first, mib, last):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect("/opsarena/gate/gate.sock")
                    s.sendall(first)
                    for _ in range(mib):
                        s.sendall(chunk)
                    s.sendall(last)
                    s.shutdown(socket.SHUT_WR)
                    b"".join(iter(lambda: s.recv(65536), b""))
            except OSError:
                pass
        line = json.dumps(head).encode()[:-1] + b', "stdin": "'
        raw = json.dumps({**head, "stdin_size": 100 << 20}).encode() + b"\\n"
        for first, mib, last, count in [(line, 132, b'"}\\n', 8), (raw, 100, b"", 6)]:
            threads = [threading.Thread(target=flood, args=(first, mib, last))
                       for _ in range(count)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        print("flooded", flush=True)
        PY
        head -c 100M /dev/urandom > "$HOME/big"
        $OPSARENA_PUT "$HOME/big" /var/tmp/big; echo "put $?"
        echo "local $(sha256sum < "$HOME/big")"
        rm "$HOME/big"
        $OPSARENA_EXEC 'echo "remote $(sha256sum < /var/tmp/big)"; rm /var/tmp/big'
        head -c 3M /dev/zero | $OPSARENA_EXEC 'wc -c'
        head -c 101M /dev/zero | $OPSARENA_EXEC 'wc -c'; echo "over $?"
        """,
        wall_s=300,
    )
    grown = rss_mib("VmHWM") - before
    print(f"arena peak grew by {grown:.0f} MiB (gate budget {GATE_BUDGET >> 20} MiB)")
    assert "flooded" in out and "put 0" in out, (out, err)
    local = re.search(r"^local (\w+)", out, re.M)
    assert local and f"remote {local[1]}" in out, out
    assert re.search(r"^3145728$", out, re.M), out
    assert "over 2" in out and "standard input over 104857600 bytes" in err, err
    assert grown < (GATE_BUDGET >> 20) + 96, f"the arena's peak grew by {grown:.0f} MiB"
    assert transcript(events), "the honest requests were served"


async def test_kernel_interfaces_no_build_needs_are_refused(
    shared_hosts: SharedHosts, tmp_path: Path
) -> None:
    host = await shared_hosts("attacker")
    out, _err, _ = await run_attack(
        host,
        tmp_path,
        """
        #!/bin/bash
        python3 - <<'PY'
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {"bpf": 321, "keyctl": 250, "perf_event_open": 298, "io_uring_setup": 425,
                 "unshare": 272, "setns": 308, "mount": 165, "ptrace": 101,
                 "process_vm_readv": 310, "open_by_handle_at": 304, "x32_getpid": 0x40000027,
                 "getpid": 39}
        for name, nr in calls.items():
            ctypes.set_errno(0)
            result = libc.syscall(nr, 0, 0, 0, 0, 0)
            print(name, "ok" if result >= 0 else os.strerror(ctypes.get_errno()), flush=True)
        PY
        """,
    )
    answers = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert answers.pop("getpid") == "ok", out
    assert answers and set(answers.values()) == {"Operation not permitted"}, answers
