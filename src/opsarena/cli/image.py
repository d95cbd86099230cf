"""`opsarena image`: build and list the host image."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from opsarena.cli.output import console, err_console
from opsarena.hosts.image import DEFAULT_IMAGE, build_image, list_images

app = typer.Typer(help="Build and list the host image.", no_args_is_help=True)


@app.command("build")
def build(
    name: Annotated[str, typer.Option("--name", help="Image name to build.")] = DEFAULT_IMAGE,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if up to date.")] = False,
    mirror: Annotated[
        str | None, typer.Option("--mirror", help="Debian mirror URL (default: mmdebstrap's).")
    ] = None,
) -> None:
    """Build the host image (Debian bookworm + systemd) unless it matches the recipe."""
    with err_console.status("building the host image") as status:

        def progress(line: str) -> None:
            status.update(line)
            err_console.print(f"  {line}", markup=False)

        asyncio.run(build_image(name, force=force, mirror=mirror, progress=progress))


@app.command("ls")
def ls() -> None:
    """List the images opsarena built."""
    table = Table("name", "id", "recipe", "size", "created")
    for column in table.columns:
        column.no_wrap = True
    for image in asyncio.run(list_images()):
        table.add_row(
            image.name,
            image.image_id,
            image.recipe,
            f"{image.size_bytes / 1e6:.0f} MB",
            image.created,
        )
    console.print(table)
