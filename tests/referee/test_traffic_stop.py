"""A fault round that stops with a PUT in flight counts that PUT as written.

A fault round's traffic goes on during the fault and is cancelled once the fault is
over (`checks._stop`). A PUT cancelled there may already have reached the service,
which then stores it; it used to be left out of the ledger, so the re-read after the
fault found a value the ledger did not know and failed an honest service with
`record_corrupted` (seen in CI on incident-repair's reference after a reboot). Here a
service on a real host stores every PUT at once and holds its answer to an overwrite:
the round is stopped while one such PUT waits, and the ledger must accept what the
service stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from opsarena.challenges import builtin_challenge
from opsarena.hosts import Host
from opsarena.ledger import Ledger, Pending, Slot, classify
from opsarena.referee.contract import CheckContext
from opsarena.workloads.records.checks import _stop, _Traffic
from opsarena.workloads.records.workload import Op, Step, TrafficPlan, slot_id, slot_value
from tests.conftest import HostFactory

pytestmark = pytest.mark.hosts

SEED = b"traffic-stop-seed"
SERVER = b"""
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR = "/var/lib/held"
os.makedirs(DIR, exist_ok=True)


class Handler(BaseHTTPRequestHandler):
    def do_PUT(self):
        name = self.path.rsplit("/", 1)[-1]
        body = self.rfile.read(int(self.headers["Content-Length"]))
        overwrite = os.path.exists(os.path.join(DIR, name))
        with open(os.path.join(DIR, ".tmp-" + name), "wb") as f:
            f.write(body)
        os.rename(os.path.join(DIR, ".tmp-" + name), os.path.join(DIR, name))
        if overwrite:
            open(os.path.join(DIR, "held-" + name), "w").close()
            self.rfile.read()  # stored, never answered: until the client goes away
            return
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        try:
            with open(os.path.join(DIR, self.path.rsplit("/", 1)[-1]), "rb") as f:
                body = f.read()
        except FileNotFoundError:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""


async def sh(host: Host, script: str) -> str:
    result = await host.exec(script, timeout=60)
    assert result.exit_code == 0, (script, result.stderr.decode(errors="replace"))
    return result.stdout.decode()


async def until_held(host: Host, record_id: str) -> None:
    """Wait until the service stored `record_id` and holds its answer."""
    held = ["test", "-e", f"/var/lib/held/held-{record_id}"]
    while not (await host.exec(held, timeout=10)).ok:
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("during_fault", [True, False], ids=["during-fault", "before-fault"])
async def test_a_put_cut_off_by_the_end_of_the_round_is_written_without_an_answer(
    host_factory: HostFactory, during_fault: bool
) -> None:
    host = await host_factory("stop")
    await host.write_file("/opt/held.py", SERVER)
    await sh(host, "systemd-run --unit held-records /usr/bin/python3 /opt/held.py")
    challenge = builtin_challenge("durable-records")
    # No answer is awaited long enough to time out: only the end of the round ends it.
    milestone = challenge.milestones[0].model_copy(update={"read_timeout_s": 600.0})
    ledger = Ledger()
    pending = Pending("t", milestone.id, 1, ledger)
    ctx = CheckContext(
        challenge=challenge, milestone=milestone, territory="t", attempt=1,
        seed=SEED, ledger=ledger, pending=pending,
    )  # fmt: skip
    first, second = (Slot("t", milestone.id, 1, f"overwrite-{n}@round-1") for n in (1, 2))
    record_id = slot_id(SEED, first)
    plan = TrafficPlan(
        steps=(
            Step((Op("put", record_id, "overwrite (first value)", first),)),
            Step((Op("put", record_id, "overwrite (second value)", second),)),
        ),
        fault_after=0,
    )
    probe = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
             "http://127.0.0.1:8080/records/none"]  # fmt: skip
    while (await host.exec(probe, timeout=10)).stdout != b"404":
        await asyncio.sleep(0.05)
    traffic = _Traffic(host, ctx, plan, step="", text=None)
    task = asyncio.create_task(traffic.run())
    await until_held(host, record_id)
    if during_fault:
        traffic.fault_began = time.monotonic()
    await _stop(traffic, task)
    assert not traffic.failures  # the PUT was still waiting for its answer
    traffic.settle(0.0)

    stored = (await host.exec(["cat", f"/var/lib/held/{record_id}"], timeout=10)).stdout
    assert stored == slot_value(SEED, second)
    entry = ledger.entries[record_id]
    # The held PUT is in the ledger without an answer: what the service stored is correct,
    # and so would the first value be, had the PUT not reached it.
    assert classify(entry, 200, hashlib.sha256(stored).hexdigest()) == "ok"
    assert classify(entry, 200, hashlib.sha256(slot_value(SEED, first)).hexdigest()) == "ok"
    assert [w.state for w in pending.writes] == ["acknowledged", "indeterminate"]
