"""Host drivers by name (`Registry`, entry point group `opsarena.hosts`).

A new driver takes: its module (a `HostDriver` and its `Host`), a `register_driver`
call (here for a built-in, or in a package's module named by an `opsarena.hosts` entry
point), and its `HostDriver.faults`. Callers find it by name (`--driver`,
`OPSARENA_DRIVER`); the host contract tests (tests/hosts/) run against every driver
`driver_names()` lists. Registering another factory under a taken name is a
`RegistryError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from opsarena.errors import DriverMissingError
from opsarena.hosts.base import HostDriver
from opsarena.registry import Registry

DRIVERS: Registry[Callable[[], HostDriver]] = Registry("host driver", "opsarena.hosts")

DRIVER_ENV = "OPSARENA_DRIVER"
"""The environment variable that names the default host driver (also read by every
command's `--driver`)."""
DEFAULT_DRIVER = os.environ.get(DRIVER_ENV) or "podman"
"""The driver every caller uses unless told otherwise: the one place outside the driver
that names it. Read once, when this module is imported."""


def register_driver(name: str, factory: Callable[[], HostDriver]) -> None:
    """Make `factory` the maker of driver `name`. Raises `RegistryError` when another
    factory has the name already."""
    DRIVERS.register(name, factory)


def driver_names() -> list[str]:
    """Every driver's name, the installed packages' included, sorted."""
    return DRIVERS.names()


def get_driver(name: str = DEFAULT_DRIVER) -> HostDriver:
    """A new driver of kind `name`. Raises `DriverMissingError` for an unknown name or
    a driver whose backend is not installed."""
    factory = DRIVERS.get(name)
    if factory is None:
        raise DriverMissingError(
            f"unknown host driver {name!r}: known drivers are {', '.join(driver_names())}"
        )
    return factory()


def _podman() -> HostDriver:
    from opsarena.hosts.podman import PodmanDriver

    return PodmanDriver()


register_driver("podman", _podman)
