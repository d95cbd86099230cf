"""The errors a user can cause or act on; the CLI prints them as one line and exits 2.

Anything that is not an `OpsArenaError` is a bug in opsarena and is raised normally.
"""

from __future__ import annotations


class OpsArenaError(Exception):
    """A problem the user can act on. `str(error)` is one line saying what is wrong and,
    where there is one, what to do about it."""


class UsageError(OpsArenaError):
    """Wrong arguments or an unknown name given on the command line."""


class HostError(OpsArenaError):
    """A host could not do what was asked: the base of every error raised by `hosts/`."""


class HostNotFoundError(HostError):
    """No host of that name exists (never created, or already removed)."""


class HostUnavailableError(HostError):
    """The host exists but the driver could not reach it: podman failed or timed out,
    or the host is not running. This is the arena's fault, never the competitor's."""


class HostBootError(HostError):
    """A host did not boot (or did not come back from a reboot) within its time limit."""


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
