"""Scripted builders by name: adding one is one line here."""

from __future__ import annotations

from opsarena.agents.scripted.backup import BACKUP_BUILDERS
from opsarena.agents.scripted.builders import (
    BinaryUnsafeBuilder,
    FoundForMissingBuilder,
    HardenedAclWritableBuilder,
    HardenedPlantedLeftBuilder,
    HardenedRootBuilder,
    HardenedSavedRootBuilder,
    HardenedStoppedOnlyBuilder,
    HardenedWritableBuilder,
    IdleBuilder,
    IgnoreIdsBuilder,
    InMemoryBuilder,
    NewestOnlyBuilder,
    NoOverwriteBuilder,
    NotEnabledBuilder,
    RacyBuilder,
    ReferenceBuilder,
    ScriptedBuilder,
    SizeLimitedBuilder,
    SlowStartBuilder,
    TlsLegacyBuilder,
    TlsNoHstsBuilder,
    TlsNoRedirectBuilder,
    TlsSelfSignedBuilder,
    VolatileBuilder,
    WebdavBuilder,
    WrongHealthBuilder,
)
from opsarena.agents.scripted.durability import DURABILITY_BUILDERS
from opsarena.agents.scripted.incident import (
    RepairCollateralBuilder,
    RepairStandInBuilder,
    RepairTransientBuilder,
    RepairWipeBuilder,
)
from opsarena.agents.scripted.releases import (
    FreshDataBuilder,
    NewestOnlyDeployBuilder,
    NoCommandBuilder,
    StopStartBuilder,
    V2FirstBuilder,
)
from opsarena.errors import UnknownBuilderError

_ALL: tuple[type[ScriptedBuilder], ...] = (
    ReferenceBuilder,
    WebdavBuilder,
    InMemoryBuilder,
    VolatileBuilder,
    NotEnabledBuilder,
    WrongHealthBuilder,
    IdleBuilder,
    IgnoreIdsBuilder,
    NewestOnlyBuilder,
    BinaryUnsafeBuilder,
    SizeLimitedBuilder,
    FoundForMissingBuilder,
    NoOverwriteBuilder,
    RacyBuilder,
    SlowStartBuilder,
    *DURABILITY_BUILDERS,
    *BACKUP_BUILDERS,
    TlsSelfSignedBuilder,
    TlsLegacyBuilder,
    TlsNoRedirectBuilder,
    TlsNoHstsBuilder,
    HardenedRootBuilder,
    HardenedPlantedLeftBuilder,
    HardenedStoppedOnlyBuilder,
    HardenedWritableBuilder,
    HardenedSavedRootBuilder,
    HardenedAclWritableBuilder,
    StopStartBuilder,
    FreshDataBuilder,
    NewestOnlyDeployBuilder,
    V2FirstBuilder,
    NoCommandBuilder,
    RepairWipeBuilder,
    RepairTransientBuilder,
    RepairCollateralBuilder,
    RepairStandInBuilder,
)
_BUILDERS: dict[str, type[ScriptedBuilder]] = {builder.name: builder for builder in _ALL}


def scripted_names() -> list[str]:
    """Every scripted builder's name, sorted."""
    return sorted(_BUILDERS)


def get_scripted(name: str) -> ScriptedBuilder:
    """A new scripted builder called `name`. Raises `UnknownBuilderError` (one line
    listing the known names) for any other name."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise UnknownBuilderError(
            f"unknown scripted builder {name!r}: known builders are {', '.join(scripted_names())}"
        ) from None
    return builder()
