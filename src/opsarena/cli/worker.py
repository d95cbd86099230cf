"""`opsarena worker check`: can this machine host territories for a Ray cluster, and how many.

Reads the machine (podman and runc on PATH, the host image, cgroups, CPUs, available
memory); the verdict is `tournament.capacity.node_problems` and `node_territories`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
from pathlib import Path
from typing import Annotated

import typer

from opsarena.cli.output import console, err_console
from opsarena.cli.tournament import _machine
from opsarena.errors import UsageError
from opsarena.hosts import DEFAULT_IMAGE, HostSpec
from opsarena.hosts.image import podman_and_image
from opsarena.tournament.capacity import NodeFacts, node_problems, node_territories

app = typer.Typer(help="Worker nodes of a Ray cluster.", no_args_is_help=True)
CGROUP = Path("/sys/fs/cgroup")


def _cgroups() -> tuple[str, frozenset[str]]:
    v2 = CGROUP / "cgroup.controllers"
    if v2.exists():
        return "v2", frozenset(v2.read_text().split())
    v1 = frozenset(p.name for p in CGROUP.iterdir() if p.is_dir()) if CGROUP.is_dir() else None
    if not v1:
        return "none", frozenset()
    return ("hybrid" if (CGROUP / "unified").is_dir() else "v1"), v1


async def read_facts(image: str) -> NodeFacts:
    """This machine, as `node_problems` judges it."""
    podman, present = await podman_and_image(image)
    cgroups, controllers = _cgroups()
    cpus, memory_mb = _machine()
    return NodeFacts(
        podman=podman, runc=shutil.which("runc") is not None, image=image,
        image_present=present, cgroups=cgroups, cgroup_controllers=controllers, cpus=cpus,
        memory_available_mb=memory_mb, host_memory_mb=HostSpec("", "", "").memory_mb,
    )  # fmt: skip


@app.command("check")
def check(
    image: Annotated[str, typer.Option("--image", help="The host image.")] = DEFAULT_IMAGE,
) -> None:
    """Say whether this machine can host territories, how many, and what is missing."""
    facts = asyncio.run(read_facts(image))
    territories = node_territories(facts)
    console.print(f"podman {facts.podman or 'missing'}; runc {'yes' if facts.runc else 'missing'}; "
                  f"image {image} {'present' if facts.image_present else 'missing'}; "
                  f"cgroups {facts.cgroups} ({' '.join(sorted(facts.cgroup_controllers)) or '-'})",
                  markup=False, emoji=False, soft_wrap=True)  # fmt: skip
    console.print(f"{facts.cpus} cores, {facts.memory_available_mb} MiB available, "
                  f"{facts.host_memory_mb} MiB per host: {territories} territories",
                  markup=False, emoji=False, soft_wrap=True)  # fmt: skip
    if importlib.util.find_spec("ray") is None:
        console.print("ray: not installed (pip install 'opsarena[ray]')", markup=False, emoji=False)
    problems = node_problems(facts)
    if problems:
        for line in problems:
            err_console.print(line, markup=False, emoji=False, soft_wrap=True)
        raise UsageError(f"this machine cannot host territories ({len(problems)} problems above)")
    console.print(
        f"ready: ray start --address HEAD:6379 --resources='{{\"opsarena_territory\": "
        f"{territories}}}'",
        markup=False, emoji=False, soft_wrap=True,
    )  # fmt: skip
