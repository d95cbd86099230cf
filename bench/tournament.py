"""Benchmark tournaments: matches per hour, controller CPU and memory, rating time.

Usage: python bench/tournament.py [--matches N] [--parallel P] [--finish MODE]
                                  [--rating-matches M] [--skip-matches]

1. Throughput: a tournament of N matches of `durable-records`, each with the demo's four
   scripted builders (reference, in-memory, not-enabled, idle), P at once, played by
   `TournamentRunner` in this process against a temporary event log. Reported: wall time,
   matches per hour, per-match wall time (from the log's first to last event), the
   controller's CPU time (this process, user+sys) and that of the podman processes it
   waited for, per match, and the process's peak RSS.
2. Ratings (pure): M simulated 4-competitor matches (Plackett-Luce draws from known
   strengths); the time of `rate_matches` (OpenSkill), one Bradley-Terry fit, the
   order check (10 shuffles) and the whole leaderboard (200 bootstrap resamples).
Needs podman and the host image for 1; uses its own ids and removes its hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import secrets
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from opsarena.ratings import Entry, MatchOutcome, leaderboard, order_check, rate_matches
from opsarena.ratings.bradley_terry import fit
from opsarena.store import SqliteEventStore, StoredEvent
from opsarena.tournament import TournamentRunner, fold_tournament, parse_tournament
from opsarena.tournament.record import TournamentFolder

BUILDERS = ("reference", "in-memory", "not-enabled", "idle")


def tournament_text(matches: int, parallel: int, finish: str) -> str:
    lines = [
        'name = "bench"',
        'challenges = ["durable-records"]',
        f"trials = {matches}",
        f"parallel = {parallel}",
        "retries = 0",
        "[match]",
        "time_limit_s = 120",
        "drain_s = 1",
        f'finish = "{finish}"',
    ]
    for name in BUILDERS:
        lines += [f"[territories.{name}]", f'agent = "scripted:{name}"']
    return "\n".join(lines) + "\n"


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def throughput(matches: int, parallel: int, finish: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "bench.toml"
        text = tournament_text(matches, parallel, finish)
        source.write_text(text)
        plan = parse_tournament(text, str(source), base=Path(tmp))
        with SqliteEventStore(Path(tmp) / "bench.db") as store:
            tid = f"bench{secrets.token_hex(3)}"
            self_before, children_before = cpu_self(), cpu_children()
            started = time.monotonic()
            runner = await TournamentRunner.create(
                store, plan, parallel=parallel, tournament_id=tid
            )
            record = await runner.run()
            wall = time.monotonic() - started
            self_cpu = cpu_self() - self_before
            children_cpu = cpu_children() - children_before
            per_match = []
            for match_id in record.counted_matches():
                events = await store.read(match_id)
                first = datetime.fromisoformat(events[0].wall)
                last = datetime.fromisoformat(events[-1].wall)
                per_match.append((last - first).total_seconds())
    counted = len(record.counted_matches())
    return {
        "matches": matches,
        "counted": counted,
        "parallel": parallel,
        "finish": finish,
        "wall_s": round(wall, 1),
        "matches_per_hour": round(counted / wall * 3600, 1),
        "match_wall_s_p50": round(statistics.median(per_match), 2),
        "match_wall_s_max": round(max(per_match), 2),
        "controller_cpu_s_per_match": round(self_cpu / max(1, counted), 2),
        "podman_cpu_s_per_match": round(children_cpu / max(1, counted), 2),
        "controller_peak_rss_mb": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
        ),
    }


def simulated(matches: int, seed: int = 1) -> list[MatchOutcome]:
    rng = random.Random(seed)
    strengths = {"a": 8.0, "b": 4.0, "c": 2.0, "d": 1.0}
    outcomes = []
    for number in range(matches):
        remaining = list(strengths)
        order = []
        while remaining:
            pick = rng.choices(remaining, weights=[strengths[n] for n in remaining])[0]
            remaining.remove(pick)
            order.append(pick)
        entries = tuple(
            Entry(name, 1000 + place if place == 0 else None, 100 - 30 * place, 100 * place)
            for place, name in enumerate(order)
        )
        outcomes.append(MatchOutcome(f"m{number}", "durable-records", entries))
    return outcomes


def ratings(matches: int) -> dict[str, Any]:
    outcomes = simulated(matches)
    ranked = [o.ranked() for o in outcomes]

    def timed(work: Any) -> float:
        started = time.perf_counter()
        work()
        return round(time.perf_counter() - started, 3)

    return {
        "rating_matches": matches,
        "openskill_s": timed(lambda: rate_matches(ranked)),
        "bradley_terry_fit_s": timed(lambda: fit(ranked)),
        "order_check_10_shuffles_s": timed(lambda: order_check(ranked, shuffles=10)),
        "leaderboard_200_bootstrap_s": timed(lambda: leaderboard(outcomes)),
    }


def tournament_fold(slots: int) -> dict[str, Any]:
    """Fold a synthetic tournament log of `slots` matches, one event at a time, as the
    controller does; and the whole log at once, as a page load does."""
    created = {
        "tournament_id": "b", "name": "", "source": "b.toml", "base_dir": "/", "text": "",
        "seed": "00" * 16, "seed_commitment": "", "retries": 0, "competitors": {},
        "slots": [{"slot": n, "challenge": "c", "trial": n, "group": ["a", "b"]}
                  for n in range(1, slots + 1)],
    }  # fmt: skip
    events = [("tournament_created", created), ("tournament_started", {"parallel": 2})]
    for n in range(1, slots + 1):
        events.append(("slot_match_started", {"slot": n, "attempt": 1, "match_id": f"b-{n}"}))
        ended = {"slot": n, "attempt": 1, "match_id": f"b-{n}", "counted": True}
        events.append(("slot_match_ended", ended))
    stored = [
        StoredEvent("tournament:b", seq, kind, seq, "2026-01-01T00:00:00.000Z", data)
        for seq, (kind, data) in enumerate(events, 1)
    ]
    started = time.perf_counter()
    folder = TournamentFolder()
    for event in stored:
        folder.apply(event)
        folder.record()
    incremental = time.perf_counter() - started
    started = time.perf_counter()
    fold_tournament(stored)
    whole = time.perf_counter() - started
    return {
        "fold_slots": slots,
        "fold_events": len(stored),
        "fold_incremental_s": round(incremental, 3),
        "fold_whole_log_s": round(whole, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matches", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--finish", choices=("first-durable", "all"), default="first-durable")
    parser.add_argument("--rating-matches", type=int, default=10_000)
    parser.add_argument("--skip-matches", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("bench/results/tournament.json"))
    args = parser.parse_args()
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    result["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    result.update(ratings(args.rating_matches))
    result.update(tournament_fold(10_000))
    if not args.skip_matches:
        result.update(asyncio.run(throughput(args.matches, args.parallel, args.finish)))
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    for key, value in result.items():
        print(f"{key:32} {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
