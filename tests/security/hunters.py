"""Hostile competitor programs for the log red-team tests, written as a competitor would.

Each is a `command:` agent script. It finds the event log the way the issue's attacker
did (here the test hands it the path in its work directory: the worst case, where the
competitor knows where the log is) and uses only ordinary tools: `sqlite3`, the CLI, HTTP.
"""

from __future__ import annotations

SEED_HUNTER = r"""
import json, os, pathlib, subprocess, sys, time, urllib.request

work = pathlib.Path(sys.argv[1])
db = (work / "db").read_text()
url = (work / "url").read_text()
match = os.environ["OPSARENA_MATCH"]
loot = []

def grab(label, produce):
    try:
        loot.append(f"== {label}\n{produce()}")
    except Exception as exc:  # a door that is shut is part of the finding
        loot.append(f"== {label} FAILED {exc!r}")

def cli(*args):
    done = subprocess.run([sys.executable, "-m", "opsarena.cli.main", *args, "--db", db],
                          capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr

def http(path, limit=None):
    with urllib.request.urlopen(url + path, timeout=10) as answer:
        return answer.read(limit).decode("utf-8", "replace")

def stream(path, seconds=3.0):
    # A live SSE stream never ends while the match runs: keep what came in `seconds`.
    got, deadline = [], time.monotonic() + seconds
    with urllib.request.urlopen(url + path, timeout=seconds) as answer:
        while time.monotonic() < deadline:
            try:
                line = answer.readline()
            except TimeoutError:
                break
            if not line:
                break
            got.append(line.decode("utf-8", "replace"))
    return "".join(got)

def files_of(path):
    return "".join(pathlib.Path(p).read_bytes().decode("latin-1")
                   for p in (path, path + "-wal", path + "-shm") if os.path.exists(p))

def processes():
    seen = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            for name in ("cmdline", "environ"):
                try:
                    seen.append((entry / name).read_bytes().decode("latin-1"))
                except OSError:
                    pass
    return "\n".join(seen)

for round in range(2):
    grab("environment", lambda: json.dumps(dict(os.environ)))
    grab("log file bytes", lambda: files_of(db))
    grab("show --json", lambda: cli("show", match, "--json"))
    grab("events --json", lambda: cli("events", match, "--json"))
    grab("ls", lambda: cli("ls"))
    grab("api list", lambda: http("/api/matches"))
    grab("api record", lambda: http(f"/api/matches/{match}"))
    grab("api events", lambda: http(f"/api/matches/{match}/events"))
    grab("api stream", lambda: stream(f"/api/matches/{match}/stream"))
    grab("page", lambda: http(f"/matches/{match}"))
    grab("processes", processes)
    time.sleep(3)
# The cage gives the hunter no writable path outside itself: its findings go to its own
# stdout, which the arena logs as agent_output (the test reads them from there).
for part in loot:
    print(part[:2000].replace("\n", " | "), flush=True)
print("looted", len(loot), "places", flush=True)
"""

FORGER = r"""
import json, os, pathlib, sqlite3, sys, time

work = pathlib.Path(sys.argv[1])
db = (work / "db").read_text()
match = os.environ["OPSARENA_MATCH"]
time.sleep(1)
conn = sqlite3.connect(db, timeout=30, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # so the arena cannot take the seqs between read and insert
top = conn.execute("SELECT MAX(seq) FROM events WHERE match_id = ?", (match,)).fetchone()[0]
for seq in range(top + 1, top + 11):
    conn.execute(
        "INSERT INTO events (match_id, seq, type, t_ms, wall, data) VALUES (?,?,?,?,?,?)",
        (match, seq, "competitor_done", 1, "2026-01-01T00:00:00.000Z",
         json.dumps({"territory": "ref", "by": "forger"})),
    )
conn.execute("COMMIT")
(work / "forged").write_text(str(top + 1))
print("forged ten rows from seq", top + 1, flush=True)
time.sleep(2)
"""

CAREFUL_FORGER = r"""
import json, os, pathlib, sqlite3, sys, time
from opsarena.store.chain import event_hash  # the chain is public: a forger has the code

work = pathlib.Path(sys.argv[1])
db = (work / "db").read_text()
match = os.environ["OPSARENA_MATCH"]
time.sleep(1)
conn = sqlite3.connect(db, timeout=30, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # the arena waits; it then chains onto the forged head
rows = conn.execute(
    "SELECT id, seq, type, t_ms, wall, data, prev_hash FROM events"
    " WHERE match_id = ? ORDER BY seq", (match,)
).fetchall()
target = next(r for r in rows if r[2] == "preflight" and json.loads(r[5])["territory"] == "ref")
prev = None
for row_id, seq, kind, t_ms, wall, data, prev_hash in rows:
    if seq < target[1]:
        continue
    payload = json.loads(data)
    if seq == target[1]:
        payload["detail"] = "forged by a careful competitor"
        data = json.dumps(payload, separators=(",", ":"))
    prev = prev_hash if prev is None else prev
    digest = event_hash(match, seq, kind, t_ms, wall, payload, prev)
    conn.execute("UPDATE events SET data = ?, prev_hash = ?, hash = ? WHERE id = ?",
                 (data, prev, digest, row_id))
    prev = digest
conn.execute("COMMIT")
(work / "forged").write_text(str(target[1]))
print("rewrote seq", target[1], "and re-chained every row after it", flush=True)
time.sleep(2)
"""
