"""Workloads: reusable judging libraries that challenges build their checks from (for
example `records`: a key-value records service's traffic, ledger checks and server).
A workload imports the engine (hosts, store, the referee's machinery), never a
challenge."""
