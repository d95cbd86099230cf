"""Measure the arena memory one command agent can make its gate hold, for docs/SECURITY.md.

Usage: python bench/gate_memory.py [--out PATH] [--src DIR]

Each attack runs in a fresh process (so its peak is its own): one real `CommandAgent`,
confined as in a match, whose program floods its own gate, against a slow stub host
(every exec and put takes `HOST_S` seconds, behind the per-competitor cap of 2 that the
controller puts on every agent's host). Reported per attack: the arena process's
resident memory before the agent starts and its peak (VmHWM) by the end, and how the
program's requests ended.

- `lines`: 8 connections, each one JSON line of 132 MiB (an exec whose standard input
  is 99 MiB of base64: the largest line the gate accepted before).
- `payloads`: 32 connections, each an exec announcing and sending 100 MiB of raw
  standard input (the largest the gate accepts now).
- `connections`: 200 connections, each sending a line just under 1 MiB (the line limit
  now) and never its newline, holding the connection open for 5 s.

`--src DIR` runs the attacks against another checkout's `src` (e.g. the code before the
change, exported with `git archive`). Needs root, cgroups and bubblewrap (as command
agents do); no podman. Writes bench/results/gate_memory.json (or `--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HOST_S = 1.0
MiB = 1 << 20
ATTACKS: dict[str, tuple[int, int]] = {
    "lines": (8, 132 * MiB),
    "payloads": (32, 100 * MiB),
    "connections": (200, MiB - 1024),
}
"""Attack -> (connections, bytes each)."""

PROGRAM = r"""#!/usr/bin/python3
import json, re, socket, sys, threading
token = re.search(r"gate.sock (\S+) ", open("/opsarena/exec").read()).group(1)
attack, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHUNK = b"A" * (1 << 20)
ended = []
def one(i):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect("/opsarena/gate/gate.sock")
        head = {"op": "exec", "command": "true", "token": token, "timeout": 300}
        if attack == "lines":
            s.sendall(json.dumps(head).encode()[:-1] + b', "stdin": "')
        elif attack == "payloads":
            s.sendall(json.dumps({**head, "stdin_size": size}).encode() + b"\n")
        remaining = size
        while remaining:
            s.sendall(CHUNK[:remaining])
            remaining -= min(remaining, len(CHUNK))
        if attack == "lines":
            s.sendall(b'"}\n')
        if attack == "connections":
            threading.Event().wait(5)  # hold the connection, never finish the line
        s.shutdown(socket.SHUT_WR)
        answer = b"".join(iter(lambda: s.recv(65536), b""))
        ended.append("answered " + answer.split(b"\n", 1)[0][:60].decode(errors="replace")
                     if answer else "closed")
    except OSError as exc:
        ended.append(f"dropped errno {exc.errno}")
threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for line in sorted(set(ended)):
    print(ended.count(line), line)
"""


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


async def one_attack(name: str) -> dict[str, Any]:
    """In this process: run the attack, return the figures."""
    from opsarena.agents.base import AgentContext
    from opsarena.agents.command import CommandAgent
    from opsarena.agents.throttle import ThrottledHost
    from opsarena.hosts import ExecResult, Host

    async def exec_(self: Host, cmd: object, *, timeout: float, input: bytes | None = None,
                    user: str | None = None, output_limit: int = 0) -> ExecResult:  # fmt: skip
        await asyncio.sleep(HOST_S)  # a slow host, holding `input` meanwhile
        return ExecResult(0, b"", b"", False, int(HOST_S * 1000))

    async def write_file(self: Host, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await asyncio.sleep(HOST_S)

    async def unused(self: Host, *args: object, **kwargs: object) -> None:
        raise NotImplementedError

    namespace: dict[str, Any] = {"exec": exec_, "write_file": write_file}
    for method in Host.__abstractmethods__:
        namespace.setdefault(method, unused)
    namespace["boots"] = property(lambda self: 1)
    namespace["init_process"] = property(lambda self: None)
    slow = type("SlowHost", (Host,), namespace)()
    slow.name, slow.territory, slow.match_id = "slow", "attacker", "bench"

    count, size = ATTACKS[name]
    events: list[tuple[str, dict[str, Any]]] = []

    async def report(kind: str, data: dict[str, Any]) -> None:
        events.append((kind, data))

    with tempfile.TemporaryDirectory() as scratch:
        program = Path(scratch) / "attack.py"
        program.write_text(PROGRAM)
        program.chmod(0o755)
        Path(scratch).chmod(0o755)
        ctx = AgentContext(
            match_id="bench", territory="attacker", brief="-", host=ThrottledHost(slow),
            deadline=time.monotonic() + 600, report=report,
        )  # fmt: skip
        agent = CommandAgent([str(program), name, str(count), str(size)], wall_s=500)
        before = rss_kib("VmRSS")
        started = time.monotonic()
        outcome = await agent.run(ctx)
        took = time.monotonic() - started
    out = "".join(d["text"] for k, d in events if k == "output" and d["stream"] == "stdout")
    return {
        "attack": name,
        "connections": count,
        "bytes_each": size,
        "rss_before_mib": round(before / 1024, 1),
        "peak_rss_mib": round(rss_kib("VmHWM") / 1024, 1),
        "seconds": round(took, 1),
        "program": outcome.terminal_detail,
        "requests": out.strip().splitlines(),
        "execs_recorded": sum(1 for k, _ in events if k == "transcript"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/results/gate_memory.json"))
    parser.add_argument("--src", type=Path, default=None, help="another checkout's src")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--one", choices=sorted(ATTACKS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one_attack(args.one))))
        return
    env = dict(os.environ)
    src = args.src or Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = str(src.resolve())
    results = []
    for name in ATTACKS:
        done = subprocess.run(
            [sys.executable, __file__, "--one", name], env=env, capture_output=True,
            text=True, check=False, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            results.append({"attack": name, "error": done.stderr.strip().splitlines()[-3:]})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "code": args.label,
        "host_seconds": HOST_S,
        "results": results,
    }
    existing = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps([*existing, record], indent=2) + "\n")


if __name__ == "__main__":
    main()
