"""Hosts: isolated machines with systemd, the `Host` contract and its drivers."""

from opsarena.hosts.base import (
    DEFAULT_FILE_LIMIT,
    DEFAULT_OUTPUT_LIMIT,
    FAULT_DISK_LOSS,
    FAULT_POWER_CUT,
    FAULT_SERVICE_CRASH,
    DiskUse,
    ExecResult,
    Host,
    HostDriver,
    HostInfo,
    HostSpec,
    ServiceRestart,
)
from opsarena.hosts.image import DEFAULT_IMAGE
from opsarena.hosts.kernel import Proc
from opsarena.hosts.registry import DEFAULT_DRIVER, driver_names, get_driver, register_driver

__all__ = [
    "DEFAULT_DRIVER",
    "DEFAULT_FILE_LIMIT",
    "DEFAULT_IMAGE",
    "DEFAULT_OUTPUT_LIMIT",
    "FAULT_DISK_LOSS",
    "FAULT_POWER_CUT",
    "FAULT_SERVICE_CRASH",
    "DiskUse",
    "ExecResult",
    "Host",
    "HostDriver",
    "HostInfo",
    "HostSpec",
    "Proc",
    "ServiceRestart",
    "driver_names",
    "get_driver",
    "register_driver",
]
