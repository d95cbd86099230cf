"""The pure parts of a host's confinement: the seccomp profile and the start hook's limits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opsarena.errors import DriverMissingError
from opsarena.hosts.podman import CLONE_NEWUSER, DEFAULT_SECCOMP, seccomp_profile


@pytest.mark.skipif(not os.path.exists(DEFAULT_SECCOMP), reason="podman's profile missing")
def test_the_profile_refuses_new_user_namespaces_and_keeps_the_rest() -> None:
    with open(DEFAULT_SECCOMP) as f:
        default = json.load(f)
    profile = json.loads(seccomp_profile(DEFAULT_SECCOMP))
    assert profile["defaultAction"] == default["defaultAction"]
    allowed = {
        n
        for r in profile["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
        for n in r["names"]
    }
    before = {
        n
        for r in default["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") and not r.get("includes")
        for n in r["names"]
    }
    assert before - allowed == {"clone", "clone3", "unshare"}
    for name in ("clone", "unshare"):
        rules = [r for r in profile["syscalls"] if r["names"] == [name]]
        allow = [r for r in rules if r["action"] == "SCMP_ACT_ALLOW"]
        deny = [r for r in rules if r["action"] == "SCMP_ACT_ERRNO"]
        assert allow[0]["args"] == [
            {"index": 0, "value": CLONE_NEWUSER, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
        ]
        assert deny[0]["args"][0]["valueTwo"] == CLONE_NEWUSER and deny[0]["errnoRet"] == 1
    clone3 = [r for r in profile["syscalls"] if r["names"] == ["clone3"]]
    assert clone3 == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]


def test_a_missing_default_profile_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DriverMissingError, match="seccomp profile"):
        seccomp_profile(str(tmp_path / "seccomp.json"))
