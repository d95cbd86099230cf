"""What the red-team tests on hosts share: running a shell script that must succeed,
waiting until a port listens, a service deployed as its own user (`deploy`), and the
programs they plant (`HEALTH`, `INOTIFY_HOG`)."""

from __future__ import annotations

import asyncio

from opsarena.hosts import Host

USER = "svc"
HEALTH = (
    "def serve(s):\n"
    "    while True:\n"
    "        c, _ = s.accept()\n"
    "        c.recv(65536)\n"
    "        c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nready')\n"
    "        c.close()\n"
    "def bound():\n"
    "    s = socket.socket()\n"
    "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    s.bind(('0.0.0.0', 8080))\n"
    "    s.listen(16)\n"
    "    return s\n"
)

INOTIFY_HOG = (
    "import ctypes, os, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "held = []\n"
    "while True:\n"
    "    fd = libc.inotify_init1(0)\n"
    "    if fd < 0: break\n"
    "    held.append(fd)\n"
    "open('/run/hog', 'w').write(str(len(held)))\n"
    "time.sleep(3600)\n"
)


async def sh(host: Host, script: str, timeout: float = 60.0) -> str:
    """`script`'s standard output; the test fails (with its stderr) when it fails."""
    result = await host.exec(script, timeout=timeout)
    assert result.exit_code == 0, (script, result.stderr.decode(errors="replace"))
    return result.stdout.decode(errors="replace")


async def wait_listening(host: Host, port: int = 8080) -> None:
    """Return once something in `host` accepts on `port` (10 s of refusals fail the test)."""
    for _ in range(200):
        try:
            _reader, writer = await host.connect(port, timeout=2)
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise AssertionError(f"nothing listened on {port}")


async def deploy(host: Host, program: str, service: str) -> None:
    """A clean host (the service's user, /var/tmp closed) whose builder-app.service runs
    `program` with the `service` lines, listening on 8080."""
    await host.write_file("/opt/server.py", program.encode())
    unit = (
        "[Unit]\nDescription=red team\n\n[Service]\n"
        f"{service}ExecStart=/usr/bin/python3 /opt/server.py\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    await host.write_file("/etc/systemd/system/builder-app.service", unit.encode())
    await sh(
        host,
        f"useradd --system --no-create-home --shell /usr/sbin/nologin {USER}\n"
        "chmod 1770 /var/tmp\n"
        "systemctl daemon-reload && systemctl enable --now builder-app.service\n",
    )
    await wait_listening(host, 8080)
