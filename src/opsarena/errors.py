"""The errors a user can cause or act on; the CLI prints them as one line and exits 2.

Anything that is not an `OpsArenaError` is a bug in opsarena and is raised normally.
"""

from __future__ import annotations

import errno


class OpsArenaError(Exception):
    """A problem the user can act on. `str(error)` is one line saying what is wrong and,
    where there is one, what to do about it."""


class UsageError(OpsArenaError):
    """Wrong arguments or an unknown name given on the command line."""


class RegistryError(UsageError):
    """A plug-in name registered twice with two different things, or an entry point
    that cannot be loaded (`opsarena.registry`)."""


class HostError(OpsArenaError):
    """A host could not do what was asked: the base of every error raised by `hosts/`."""


class HostNotFoundError(HostError):
    """No host of that name exists (never created, or already removed)."""


class HostUnavailableError(HostError):
    """The host exists but the driver could not reach it: podman failed or timed out,
    or the host is not running. This is the arena's fault, never the competitor's."""


class HostBootError(HostError):
    """A host did not boot (or did not come back from a reboot) within its time limit."""


class BootFailedError(HostBootError):
    """The host booted into a state only its own contents explain: its systemd answered,
    but reached emergency or rescue mode, or was still starting units when the time was
    up. The competitor's doing (a broken fstab, a unit that holds the boot), not the
    arena's."""


class HostFactsTooLargeError(HostError):
    """What the arena would read about a host from outside (its socket table, its open
    files) is beyond the bound it reads: the competitor's doing (a service needs a few
    sockets and files, not tens of thousands)."""


class PathMissingError(HostError):
    """A directory a fault needs (a disk loss's data directory) is not a plain directory
    in the host: missing, a symlink on the way, or holding a mount point. The
    competitor's doing: the challenge told it where to keep its data."""


class ImageMissingError(HostError):
    """The host image is not there; `opsarena image build` makes it."""


class DriverMissingError(HostError):
    """The host driver's backend (for example the podman binary) is not installed,
    or no driver is registered under the name asked for."""


class HostFileError(HostError):
    """`read_file` or `write_file` failed: missing file, a directory, or over the size limit."""


class UnitMissingError(HostError):
    """The systemd unit named does not exist in the host (the competitor's fault)."""


class ServiceNotRunningError(HostError):
    """The systemd unit exists but has no running main process (the competitor's fault)."""


class ServiceRestartError(HostError):
    """`systemctl restart` did not produce a new main process within the bound."""


class ServiceNotRestartedError(ServiceRestartError):
    """After the arena killed a unit (`Host.crash_service`), systemd did not start a new
    main process within the bound: the unit does not restart itself after a crash
    (no `Restart=`), the competitor's fault."""


class DiskMeasureError(HostError):
    """A host's disk could not be measured: counting its writable layer failed or ran past
    its time. What the host wrote there decides that, so it is the host's doing; the arena
    freezes such a disk rather than leave it unbounded."""


class FaultUnsupportedError(HostError):
    """The host (its driver, or the way it was created) cannot undergo the fault asked
    for: e.g. a power cut on a host created without a power-cut disk."""


class ShellUnsupportedError(HostError):
    """The host's driver cannot give an interactive shell in it (`Host.shell_argv`)."""


class StoreError(OpsArenaError):
    """The event log cannot be used: the file is not an opsarena event log, was written by
    a newer opsarena, or cannot be opened."""


class NoEventLogError(StoreError):
    """There is no event log at the path yet: no file, or an empty one (a writer that is
    creating it has not made its tables). A reader may simply try again later."""


class LogTamperedError(StoreError):
    """The event log holds rows the arena did not append: a sequence number it was about
    to take is taken, or the row it would chain to does not match its hash. `seq` is the
    first sequence number found wrong; nothing was written."""

    def __init__(self, message: str, *, match_id: str, seq: int) -> None:
        super().__init__(message)
        self.match_id = match_id
        self.seq = seq


class MatchNotFoundError(OpsArenaError):
    """No match with that id is in the event log."""


class EventLogError(OpsArenaError):
    """A match's event log describes something impossible (an unknown event, a transition a
    state machine forbids, a gap in the sequence), so no record can be folded from it."""


class ChallengeError(OpsArenaError):
    """A challenge is unknown, or its file is invalid. `problems` holds one line per
    problem (file, field, what is wrong); `str()` joins them into one line."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class PreflightError(OpsArenaError):
    """A fresh host already passes the first milestone: the challenge or the host image
    is broken, and no match may start on it."""


class UnknownBuilderError(UsageError):
    """No scripted builder has that name."""


class AgentSpecError(OpsArenaError):
    """An agent spec (`llm:MODEL`, `command:PROGRAM ...`, `scripted:NAME`, `human`) or its
    settings are wrong: unknown kind, missing argument, a setting that does not apply."""


class AgentConfigError(OpsArenaError):
    """An agent cannot start: no LLM endpoint configured or reachable, a key missing or
    refused, a program not found."""


class CompetitorsFileError(OpsArenaError):
    """A competitors file is missing, not TOML, or invalid; the message has one line per
    problem, naming the file and the field."""


class MatchError(OpsArenaError):
    """A match could not start or go on (hosts not provisioned, preflight refused, bad
    plan); the log is closed and the hosts removed before it is raised."""


class ServeError(OpsArenaError):
    """The scoreboard cannot serve: its address cannot be bound (port taken, unknown host)."""


class HostDownError(HostUnavailableError):
    """The host stopped by itself (its init was killed for lack of memory, or exited)
    while the arena was not rebooting it: the competitor's doing, not the arena's."""


class TournamentError(OpsArenaError):
    """A tournament file is missing or invalid (one line per problem, naming the file and
    the field), or a tournament id is unknown or cannot be resumed."""


class HostNetworkRefusedError(ConnectionError):
    """A connection made inside a host's own network namespace was refused by that
    network before it reached the port: no route, the interface down, a firewall rule,
    no local port left (ENETUNREACH, EHOSTUNREACH, ENETDOWN, EACCES, EPERM,
    EADDRNOTAVAIL from connect). The competitor is root there, so it is the competitor's
    doing; `errno` keeps the kernel's."""

    NETWORK_ERRNOS = frozenset(
        {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EACCES, errno.EPERM,
         errno.EADDRNOTAVAIL}
    )  # fmt: skip
