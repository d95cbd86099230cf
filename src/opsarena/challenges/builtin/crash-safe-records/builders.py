"""crash-safe-records' scripted builders: the ones that calibrate the crash and power-cut faults.

Each runs the shared records server with one classic durability bug (the bugs LazyFS,
ALICE and CrashMonkey find in real storage software). Designed verdicts
(service-up, write-read, service-restart and host-reboot pass for all of them;
`calibration.toml` has the calibrated ones):

| builder          | service-crash              | power-cut                         |
|------------------|----------------------------|-----------------------------------|
| reference        | pass                       | pass                              |
| no-fsync         | pass                       | record_missing (un-synced records) |
| ack-before-write | record_missing             |                                   |
| no-restart       | not restarted after crash  |                                   |
| fsync-no-dirsync | pass                       | the last rename(s) may be lost    |

`fsync-no-dirsync` loses a record only when no later fsync committed its rename (on
ext4 an fsync commits the whole journal transaction): at most the records renamed
after the last fsync before the cut. `bench/faults.py` measures how often.
"""

from __future__ import annotations

from opsarena.agents.scripted import IdleBuilder, RecordsServiceBuilder, ScriptedBuilder


class ReferenceBuilder(RecordsServiceBuilder):
    """Durable (fsync, atomic rename, directory fsync), enabled, restarted: passes all."""

    name = "reference"


class NoFsyncBuilder(RecordsServiceBuilder):
    """One file per record, written in place, never fsynced: survives restarts, crashes
    and clean reboots (the page cache keeps it); a power cut loses it."""

    name = "no-fsync"
    durability = "no-fsync"


class AckBeforeWriteBuilder(RecordsServiceBuilder):
    """Answers a PUT at once and stores it durably seconds later, or at SIGTERM: a clean
    restart loses nothing, a crash loses the records still waiting."""

    name = "ack-before-write"
    durability = "ack-before-write"


class NoRestartBuilder(RecordsServiceBuilder):
    """Durable, enabled, but its unit has no `Restart=`: a crash leaves it dead."""

    name = "no-restart"
    restart = False


class FsyncNoDirsyncBuilder(RecordsServiceBuilder):
    """Temporary file, fsync, rename over the record, and no fsync of the directory: the
    rename is not durable until something else commits it."""

    name = "fsync-no-dirsync"
    durability = "no-dirsync"


BUILDERS: tuple[type[ScriptedBuilder], ...] = (
    ReferenceBuilder,
    IdleBuilder,
    NoFsyncBuilder,
    AckBeforeWriteBuilder,
    NoRestartBuilder,
    FsyncNoDirsyncBuilder,
)
