"""Host drivers by name: a new driver registers here and no caller changes."""

from __future__ import annotations

from collections.abc import Callable

from opsarena.errors import DriverMissingError
from opsarena.hosts.base import HostDriver

_FACTORIES: dict[str, Callable[[], HostDriver]] = {}


def register_driver(name: str, factory: Callable[[], HostDriver]) -> None:
    """Make `factory` the maker of driver `name` (replacing any earlier one)."""
    _FACTORIES[name] = factory


def driver_names() -> list[str]:
    return sorted(_FACTORIES)


def get_driver(name: str = "podman") -> HostDriver:
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
