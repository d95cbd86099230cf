"""The one registry helper (`opsarena.registry`): one duplicate rule, entry points read
on demand."""

from __future__ import annotations

import pytest

from opsarena.errors import RegistryError
from opsarena.registry import Registry


def test_a_name_taken_by_another_thing_is_a_clear_error_and_the_same_thing_again_is_not() -> None:
    registry: Registry[object] = Registry("widget", "opsarena.test-widgets")

    def first() -> None: ...

    def second() -> None: ...

    registry.register("w", first)
    registry.register("w", first)
    with pytest.raises(RegistryError, match="a widget named 'w' is registered already"):
        registry.register("w", second)
    assert registry.get("w") is first
    assert registry.names() == ["w"] and "w" in registry and "v" not in registry
    assert registry.get("v") is None
