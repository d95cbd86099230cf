"""Host drivers by name: a new driver registers here and no caller changes."""

from __future__ import annotations

import os
from collections.abc import Callable

from opsarena.errors import DriverMissingError
from opsarena.hosts.base import HostDriver

_FACTORIES: dict[str, Callable[[], HostDriver]] = {}

DRIVER_ENV = "OPSARENA_DRIVER"
"""The environment variable that names the default host driver (also read by every
command's `--driver`)."""
DEFAULT_DRIVER = os.environ.get(DRIVER_ENV) or "podman"
"""The driver every caller uses unless told otherwise: the one place outside the driver
that names it. Read once, when this module is imported."""


def register_driver(name: str, factory: Callable[[], HostDriver]) -> None:
    """Make `factory` the maker of driver `name` (replacing any earlier one)."""
    _FACTORIES[name] = factory


def driver_names() -> list[str]:
    return sorted(_FACTORIES)


def get_driver(name: str = DEFAULT_DRIVER) -> HostDriver:
    """A new driver of kind `name`. Raises `DriverMissingError` for an unknown name or
    a driver whose backend is not installed."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise DriverMissingError(
            f"unknown host driver {name!r}: known drivers are {', '.join(driver_names())}"
        ) from None
    return factory()


def _podman() -> HostDriver:
    from opsarena.hosts.podman import PodmanDriver

    return PodmanDriver()


register_driver("podman", _podman)
