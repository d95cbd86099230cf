"""Named plug-ins: one registry helper for checks, faults, host drivers, agent kinds,
stores and challenges, with one duplicate rule and package entry points.

A registry maps names to things of one kind. Registering a name twice with two different
things is an error (`RegistryError`, one line naming both); registering the same thing
again is harmless (a module imported twice). Each registry has an entry point group
(`opsarena.faults`, `opsarena.hosts`, ...): an installed package that declares

    [project.entry-points."opsarena.faults"]
    my-fault = "my_package.faults"

has `my_package.faults` imported the first time the registry is asked for a name it does
not know, or for its list of names; the module registers its plug-ins as a built-in
module does (a decorator or a `register` call at import), or names a function that
registers them when called. A registry may instead say what its entry points give
(`on_load`: the challenges' names a module whose directory holds challenge directories).
An entry point that cannot be loaded is an error naming the package, never skipped in
silence: at every ask, not only the first. The core imports no optional integration:
entry points are read only when a registry is asked.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from opsarena.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """Things of one `kind` by name, extensible through entry point `group`."""

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        on_load: Callable[[Registry[T], Any], None] | None = None,
    ) -> None:
        """`on_load(registry, loaded)` registers what an entry point's loaded object gives;
        by default a function is called and a module is only imported."""
        self.kind, self.group = kind, group
        self._items: dict[str, T] = {}
        self._loaded = False
        self._loading = False
        self._on_load = on_load or _call_functions
        self._lock = threading.RLock()

    def register(self, name: str, item: T) -> T:
        """Register `item` as `name` and return it. Raises `RegistryError` when another
        thing has the name already."""
        with self._lock:
            existing = self._items.get(name)
            if existing is not None and existing is not item and existing != item:
                article = "an" if self.kind[:1] in "aeiou" else "a"
                raise RegistryError(
                    f"{article} {self.kind} named {name!r} is registered already "
                    f"({_origin(existing)}; this one: {_origin(item)})"
                )
            self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@registry.decorator(name)`: register the decorated thing as `name`."""

        def register(item: T) -> T:
            return self.register(name, item)

        return register

    def get(self, name: str) -> T | None:
        """The thing registered as `name` (plug-ins loaded first when it is unknown), or None."""
        if name not in self._items:
            self.load_entry_points()
        return self._items.get(name)

    def names(self) -> list[str]:
        """Every registered name, plug-ins included, sorted."""
        self.load_entry_points()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, T]]:
        self.load_entry_points()
        return sorted(self._items.items())

    def load_entry_points(self) -> None:
        """Import every module of this registry's entry point group, once they all
        loaded. Raises `RegistryError` naming the entry point that cannot be loaded (again
        at the next ask: a broken plug-in is never forgotten). A plug-in asking its own
        registry while it loads sees what is registered so far."""
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                for entry in importlib.metadata.entry_points(group=self.group):
                    try:
                        self._on_load(self, entry.load())
                    except Exception as exc:
                        raise RegistryError(
                            f"the {self.group} entry point {entry.name!r} ({entry.value}) "
                            f"cannot be loaded: {exc.__class__.__name__}: {exc}"
                        ) from exc
                self._loaded = True
            finally:
                self._loading = False

    def forget_entry_points(self) -> None:
        """Read the entry point group again at the next ask (after a package was
        installed while running)."""
        with self._lock:
            self._loaded = False


def _call_functions(registry: Registry[Any], loaded: object) -> None:
    """The default `on_load`: an entry point naming a function has it called (it
    registers its plug-ins); one naming a module was imported, which registered them."""
    if callable(loaded) and not isinstance(loaded, type):
        loaded()


def _origin(item: object) -> str:
    """Where `item` comes from, for a message: a path as itself, a function or class by
    its module and name, a record of one (an agent kind) by its `factory`'s."""
    if isinstance(item, os.PathLike):
        return str(item)
    factory = getattr(item, "factory", None)
    if not hasattr(item, "__qualname__") and callable(factory):
        return _origin(factory)
    module = getattr(item, "__module__", None) or type(item).__module__
    name = getattr(item, "__qualname__", None) or type(item).__qualname__
    return f"{module}.{name}"
