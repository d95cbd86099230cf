"""`opsarena hosts`: bring up, use, fault and remove hosts by hand.

A NAME is a territory of a host made by `hosts up` (`demo`), `MATCH/TERRITORY`
for a match's host, or a full host name (`opsarena-MATCH-TERRITORY`).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from typing import Annotated

import typer
from rich.table import Table

from opsarena.cli.output import console, err_console
from opsarena.errors import HostNotFoundError, UsageError
from opsarena.hosts import DEFAULT_DRIVER, DEFAULT_IMAGE, Host, HostSpec, get_driver
from opsarena.hosts.base import DEFAULT_DISK_MB, DEFAULT_WRITE_IOPS, DEFAULT_WRITE_MBPS

MANUAL_MATCH = "cli"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")

app = typer.Typer(help="Bring up, use, fault and remove hosts.", no_args_is_help=True)

DriverOption = Annotated[
    str, typer.Option("--driver", help="Host driver.", envvar="OPSARENA_DRIVER")
]


def check_name(kind: str, value: str) -> str:
    """Return `value` if it is a valid match or territory name; else raise `UsageError`."""
    if not NAME_RE.match(value):
        raise UsageError(
            f"{kind} {value!r} is not valid: use 1-40 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return value


def host_name(name: str) -> str:
    """The driver's host name for a NAME given on the command line."""
    if name.startswith("opsarena-"):
        return name
    if "/" in name:
        match_id, _, territory = name.partition("/")
        return f"opsarena-{check_name('match', match_id)}-{check_name('territory', territory)}"
    return f"opsarena-{MANUAL_MATCH}-{check_name('host name', name)}"


async def _get(driver_name: str, name: str) -> Host:
    driver = get_driver(driver_name)
    try:
        return await driver.get(host_name(name))
    except HostNotFoundError:
        raise HostNotFoundError(f"no host named {name!r}: `opsarena hosts ls` lists them") from None


@app.command("up")
def up(
    name: Annotated[str, typer.Argument(help="Name of the new host.")],
    image: Annotated[str, typer.Option(help="Host image.")] = DEFAULT_IMAGE,
    cpus: Annotated[float, typer.Option(min=0.1, max=64, help="CPUs.")] = 1.0,
    memory: Annotated[int, typer.Option(min=64, help="Memory in MiB.")] = 512,
    pids: Annotated[int, typer.Option(min=64, help="Most processes.")] = 1024,
    power_cut: Annotated[
        bool, typer.Option("--power-cut", help="Give it a disk that can lose power.")
    ] = False,
    disk: Annotated[int, typer.Option(min=64, help="Disk size in MiB.")] = DEFAULT_DISK_MB,
    write_mbps: Annotated[
        int, typer.Option(min=0, help="Cap on its disk writes, MiB/s (0: none).")
    ] = DEFAULT_WRITE_MBPS,
    write_iops: Annotated[
        int, typer.Option(min=0, help="Cap on its disk write requests a second (0: none).")
    ] = DEFAULT_WRITE_IOPS,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Create and boot a host; returns once systemd in it is up."""
    spec = HostSpec(
        match_id=MANUAL_MATCH, territory=check_name("host name", name), image=image,
        cpus=cpus, memory_mb=memory, pids_limit=pids, power_cut=power_cut, disk_mb=disk,
        disk_write_mbps=write_mbps, disk_write_iops=write_iops,
    )  # fmt: skip
    with err_console.status(f"booting {name}"):
        host = asyncio.run(get_driver(driver).create(spec))
    console.print(f"{name} is up ({host.name}); try: opsarena hosts shell {name}")


@app.command("ls")
def ls(
    match: Annotated[str | None, typer.Option("--match", help="Only this match's hosts.")] = None,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """List the hosts opsarena made."""
    infos = asyncio.run(get_driver(driver).list(match_id=match))
    table = Table("name", "match", "territory", "state", "image")
    for info in infos:
        short = (
            info.territory if info.match_id == MANUAL_MATCH else f"{info.match_id}/{info.territory}"
        )
        table.add_row(short, info.match_id, info.territory, info.state, info.image)
    console.print(table)


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(
    name: Annotated[str, typer.Argument(help="Host.")],
    command: Annotated[list[str], typer.Argument(help="Command and its arguments (after --).")],
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds before it is killed.")] = 300.0,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Run a command in a host; its output and exit code pass through."""

    if command and command[0] == "--":  # options stop at NAME, so `--` arrives here
        command = command[1:]
    if not command:
        raise UsageError("hosts exec needs a command: opsarena hosts exec NAME -- CMD...")

    async def run() -> int:
        host = await _get(driver, name)
        stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
        result = await host.exec(command, timeout=timeout, input=stdin or None)
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(result.stderr)
        if result.truncated:
            err_console.print(
                "opsarena: output past its limit on a stream: the command was ended",
                markup=False,
            )
        if result.timed_out:
            err_console.print(f"opsarena: killed after {timeout:g}s", markup=False)
        return result.exit_code

    raise typer.Exit(asyncio.run(run()))


@app.command("shell")
def shell(
    name: Annotated[str, typer.Argument(help="Host.")],
    user: Annotated[
        str | None, typer.Option("--user", help="As this user (default: root).")
    ] = None,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Open an interactive bash in a host (as root unless --user)."""
    host = asyncio.run(_get(driver, name))
    argv = host.shell_argv(user=user, tty=sys.stdin.isatty())
    os.execvp(argv[0], argv)


@app.command("restart-service")
def restart_service(
    name: Annotated[str, typer.Argument(help="Host.")],
    unit: Annotated[str, typer.Argument(help="systemd unit.")],
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Restart a unit; returns once it has a new main process."""

    async def run() -> int:
        return (await (await _get(driver, name)).restart_service(unit)).main_pid

    console.print(f"{unit} restarted; main PID is now {asyncio.run(run())}")


@app.command("crash-service")
def crash_service(
    name: Annotated[str, typer.Argument(help="Host.")],
    unit: Annotated[str, typer.Argument(help="systemd unit.")],
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for the restart.")
    ] = 10.0,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """SIGKILL every process of a unit at once; returns once systemd restarted it."""

    async def run() -> int:
        return await (await _get(driver, name)).crash_service(unit, timeout=timeout)

    console.print(f"{unit} crashed and was restarted; main PID is now {asyncio.run(run())}")


@app.command("power-cut")
def power_cut(
    name: Annotated[str, typer.Argument(help="Host (made with --power-cut).")],
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Cut a host's power (un-synced writes may be lost) and wait until it is ready."""

    async def run() -> None:
        await (await _get(driver, name)).power_cut()

    with err_console.status(f"cutting the power of {name}"):
        asyncio.run(run())
    console.print(f"{name} lost power, booted and is ready")


@app.command("reboot")
def reboot(
    name: Annotated[str, typer.Argument(help="Host.")],
    hard: Annotated[bool, typer.Option("--hard", help="Kill every process at once.")] = False,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Reboot a host (clean by default) and wait until it is ready again."""

    async def run() -> None:
        host = await _get(driver, name)
        await host.reboot(hard=hard)

    with err_console.status(f"rebooting {name}"):
        asyncio.run(run())
    console.print(f"{name} rebooted ({'hard' if hard else 'clean'}) and is ready")


@app.command("rm")
def rm(
    names: Annotated[list[str], typer.Argument(help="Hosts to remove.")],
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Remove hosts at once."""

    async def run() -> None:
        hosts = [await _get(driver, name) for name in names]
        the_driver = get_driver(driver)
        await asyncio.gather(*(the_driver.remove(host.name) for host in hosts))

    asyncio.run(run())
    console.print(f"removed {', '.join(names)}")


@app.command("cleanup")
def cleanup(
    match: Annotated[str | None, typer.Option("--match", help="Remove this match's hosts.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every opsarena host.")] = False,
    driver: DriverOption = DEFAULT_DRIVER,
) -> None:
    """Remove hosts opsarena made (and nothing else): one match's, or all of them."""
    if (match is None) == (not all_):
        raise UsageError("hosts cleanup needs exactly one of --match MATCH or --all")
    removed = asyncio.run(get_driver(driver).cleanup(match_id=match))
    console.print(
        f"removed {len(removed)} host(s)" + (f": {', '.join(removed)}" if removed else "")
    )
