"""What confines a podman host, written once into the arena's state directory: the
seccomp profile that denies new user namespaces, the OCI start hook's configuration
(`hosts/start_hook.py`), and the checks of the machine's id ranges and inotify budget
(`Podman._prepare_confinement` says how they are used).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from opsarena.errors import DriverMissingError

HOOK_ANNOTATION = "opsarena.start-hook"
DEFAULT_SECCOMP = "/usr/share/containers/seccomp.json"
CLONE_NEWUSER = 0x10000000
ENOSYS = 38
EPERM = 1


MACHINE_INOTIFY_INSTANCES = 8192
"""Least inotify budget of the machine's root the driver accepts (hosts are capped at 64
each in their own namespace by `start_hook`, and all are charged to root as well)."""


def read_int(path: str) -> int | None:
    try:
        with open(path) as value:
            return int(value.read())
    except (OSError, ValueError):
        return None


def has_subids(user: str) -> bool:
    """Whether /etc/subuid and /etc/subgid both give `user` a range."""
    for name in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(name) as listing:
                if not any(line.split(":", 1)[0] == user for line in listing):
                    return False
        except FileNotFoundError:
            return False
    return True


def write_once(directory: Path, name: str, data: bytes) -> Path:
    """`directory/<sha>-name` holding `data`, written atomically if not there yet (many
    arena processes share it; the content names the file, so none overwrites another)."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()[:16]
    if name == "hook.json":  # podman reads every *.json of a hooks directory
        directory = directory / f"hooks-{digest}"
        directory.mkdir(exist_ok=True)
        path = directory / name
    else:
        path = directory / f"{digest}-{name}"
    if not path.exists():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_bytes(data)
        temporary.chmod(0o644)
        os.replace(temporary, path)
    return path


def hook_config() -> bytes:
    hook = str(Path(__file__).parent.parent / "start_hook.py")
    config = {
        "version": "1.0.0",
        "hook": {"path": sys.executable, "args": [sys.executable, "-I", "-S", hook]},
        "when": {"annotations": {f"^{re.escape(HOOK_ANNOTATION)}$": ".*"}},
        "stages": ["createRuntime"],
    }
    return json.dumps(config, indent=1).encode()


def seccomp_profile(default_path: str) -> bytes:
    """Podman's default seccomp profile at `default_path`, changed so a host cannot make
    user namespaces: clone and unshare with `CLONE_NEWUSER` fail with EPERM, clone3
    (whose flags seccomp cannot read) fails with ENOSYS. Everything else is unchanged.
    Raises `DriverMissingError` when the default profile is not there."""
    try:
        with open(default_path) as default:
            profile: dict[str, Any] = json.load(default)
    except OSError as exc:
        raise DriverMissingError(
            f"podman's default seccomp profile {default_path} is missing: "
            "apt-get install golang-github-containers-common"
        ) from exc
    denied = {"clone", "clone3", "unshare"}
    for rule in profile["syscalls"]:
        if rule.get("action") == "SCMP_ACT_ALLOW":
            rule["names"] = [name for name in rule["names"] if name not in denied]
    profile["syscalls"] = [rule for rule in profile["syscalls"] if rule["names"]]
    without_newuser = {
        "index": 0,
        "value": CLONE_NEWUSER,
        "valueTwo": 0,
        "op": "SCMP_CMP_MASKED_EQ",
    }
    with_newuser = {**without_newuser, "valueTwo": CLONE_NEWUSER}
    for name in ("clone", "unshare"):
        profile["syscalls"].append(
            {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [without_newuser]}
        )
        profile["syscalls"].append(
            {
                "names": [name],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [with_newuser],
            }
        )
    profile["syscalls"].append(
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}
    )
    return json.dumps(profile, indent=1).encode()
