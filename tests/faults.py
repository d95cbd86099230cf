"""A plug-in fault for tests: registered as a package's fault would be, declaring that it
needs a power-cut disk under a name no built-in code knows."""

from __future__ import annotations

from opsarena.referee.nemesis import PowerCutFault, register_fault

BROWNOUT = "test-brownout"


@register_fault
class BrownoutFault(PowerCutFault):
    """The power-cut fault under another name: only its capability says it needs the disk."""

    name = BROWNOUT
    after = "after the brownout"
    needs_power_cut_disk = True
