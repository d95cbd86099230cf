"""Reading a match record imports no judging code (issue 24's layers): the fold and the
event log stand on the ledger and the store, never on the referee, a challenge, a host
driver or a workload."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

JUDGING = ("opsarena.referee", "opsarena.challenges", "opsarena.hosts", "opsarena.workloads")


@pytest.mark.parametrize("module", ["opsarena.match.fold", "opsarena.match.events"])
def test_reading_a_record_imports_no_judging_code(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    loaded = json.loads(done.stdout)
    pulled = [m for m in loaded if m in JUDGING or m.startswith(tuple(p + "." for p in JUDGING))]
    assert pulled == [], f"importing {module} pulled in judging code: {pulled}"
