"""The one registry helper (`opsarena.registry`): one duplicate rule, entry points read
on demand."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsarena.errors import RegistryError
from opsarena.referee.nemesis import Fault
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


def test_every_registry_refuses_another_thing_under_a_taken_name() -> None:
    from opsarena.agents.registry import agent_kinds, register_agent_kind
    from opsarena.hosts import driver_names, get_driver, register_driver
    from opsarena.hosts.podman import PodmanDriver
    from opsarena.referee.nemesis import RestartFault, get_fault, register_fault

    # Before issue 24 these two replaced the built-in in silence.
    with pytest.raises(RegistryError, match="a host driver named 'podman' is registered already"):
        register_driver("podman", PodmanDriver)
    with pytest.raises(RegistryError, match="an agent kind named 'scripted' is registered"):
        register_agent_kind("scripted", lambda spec, settings, env: None, arg=None)  # type: ignore[arg-type,return-value]

    class AnotherRestart(RestartFault):
        pass

    with pytest.raises(RegistryError, match=r"a fault named 'restart' .*AnotherRestart"):
        register_fault(AnotherRestart)
    # The built-ins are untouched, and registering one of them again is harmless.
    assert isinstance(get_driver("podman"), PodmanDriver) and "podman" in driver_names()
    assert type(get_fault("restart")) is RestartFault
    assert register_fault(RestartFault) is RestartFault
    assert "scripted" in agent_kinds()


def test_a_fault_on_the_host_method_of_an_offered_one_is_offered_too() -> None:
    from opsarena.challenges import builtin_challenge
    from opsarena.referee.model import Milestone
    from opsarena.referee.nemesis import CrashFault, missing_faults, offered_faults

    @register_fault_once
    class CrashTwice(CrashFault):
        name = "test-crash-twice"

    challenge = builtin_challenge("durable-records")
    extra = Milestone(id="x", title="t", points=1, check="fault-durability", fault=CrashTwice.name)
    needing = challenge.model_copy(update={"milestones": [*challenge.milestones, extra]})
    assert CrashTwice.name in offered_faults({"restart", "reboot", "crash"})
    assert missing_faults(needing, {"restart", "reboot", "crash"}, "toy") is None
    lacking = missing_faults(needing, {"restart", "reboot"}, "toy")
    assert lacking is not None and "needs the faults test-crash-twice" in lacking


def register_fault_once(cls: type[Fault]) -> type[Fault]:
    from opsarena.referee.nemesis import FAULTS, register_fault

    return cls if FAULTS.get(cls.name) is not None else register_fault(cls)


def test_entry_points_load_on_demand_and_a_broken_one_fails_every_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group, module = WIDGETS.group, "opsarena_test_widgets"
    (tmp_path / f"{module}.py").write_text(
        "from tests.test_registry import WIDGETS\nWIDGETS.register('plug', 'a plug-in widget')\n"
    )
    dist = tmp_path / "widgets-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: widgets\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\nplug = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert WIDGETS.get("plug") == "a plug-in widget" and WIDGETS.names() == ["plug"]

    broken: Registry[str] = Registry("widget", group + "-broken")
    (dist / "entry_points.txt").write_text(f"[{group}-broken]\nnope = {module}_missing\n")
    for _ in range(2):
        with pytest.raises(RegistryError, match=f"entry point 'nope' \\({module}_missing\\)"):
            broken.names()


WIDGETS: Registry[str] = Registry("widget", "opsarena.test-widgets")
"""What the entry point test's plug-in module registers into."""
