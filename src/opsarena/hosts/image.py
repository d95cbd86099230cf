"""The host image: Debian bookworm with systemd, built by mmdebstrap, imported into podman.

This is the podman driver's image builder (`PodmanDriver.prepare_image`, `opsarena
image`): other drivers get their images elsewhere. The image carries a label with a
hash of its recipe, so `build_image` does nothing when the image there was built from
the current recipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from opsarena.errors import DriverMissingError, HostError, UsageError

DEFAULT_IMAGE = "localhost/opsarena-host:bookworm"
RECIPE_LABEL = "opsarena.recipe"
BUILD_TIMEOUT = 20 * 60.0

PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "curl",
    "ca-certificates",
    "procps",
    "iproute2",
    "nano",
    "less",
    # A real third-party web server able to take PUT (its DAV module), installed but
    # left disabled: the `webdav` scripted builder configures it.
    "nginx-light",
)

# Run in the finished tree ("$1"): the image must not serve anything by itself.
CUSTOMIZE_HOOKS = (
    'chroot "$1" systemctl disable nginx.service',
    'rm -f "$1"/etc/nginx/sites-enabled/default',
    'chroot "$1" systemctl mask systemd-resolved.service apt-daily.timer apt-daily-upgrade.timer',
    'rm -f "$1"/etc/machine-id && touch "$1"/etc/machine-id',
)

IMPORT_CHANGES = (
    'CMD ["/sbin/init"]',
    "STOPSIGNAL SIGRTMIN+3",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
)


@dataclass(frozen=True)
class ImageInfo:
    name: str
    image_id: str
    recipe: str
    size_bytes: int
    created: str


def recipe_hash(
    suite: str = "bookworm", mirror: str | None = None, extra: tuple[str, ...] = ()
) -> str:
    """A short hash of everything that decides what the image contains. `extra` are
    packages a challenge adds (they enter the hash only when there are some, so the
    default image's recipe, and tag, never change)."""
    recipe: dict[str, object] = {
        "suite": suite,
        "mirror": mirror or "",
        "variant": "minbase",
        "packages": PACKAGES,
        "hooks": CUSTOMIZE_HOOKS,
        "changes": IMPORT_CHANGES,
    }
    if extra:
        recipe["extra"] = sorted(set(extra))
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def image_for(packages: tuple[str, ...] | list[str], base: str = DEFAULT_IMAGE) -> str:
    """The image a challenge runs on: `base` itself when it adds no packages, else a tag
    derived from the recipe with them (`localhost/opsarena-host:bookworm-<hash>`), so two
    challenges with the same additions share one image. Pure."""
    if not packages:
        return base
    repository = base.rsplit(":", 1)[0] if ":" in base.rsplit("/", 1)[-1] else base
    return f"{repository}:bookworm-{recipe_hash(extra=tuple(packages))}"


async def _podman(*args: str, timeout: float = 120.0) -> tuple[int, str, str]:
    podman = shutil.which("podman")
    if not podman:
        raise DriverMissingError("podman is not installed: run ./bootstrap")
    proc = await asyncio.create_subprocess_exec(
        podman, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        raise HostError(f"podman {args[0]} did not finish within {timeout:g}s") from None
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def podman_and_image(image: str, *, timeout: float = 30.0) -> tuple[str | None, bool]:
    """podman's version (None when it is not installed or does not answer within
    `timeout`) and whether `image` is there: what `opsarena worker check` reads of podman,
    on a machine that may lack it."""
    try:
        code, out, _err = await _podman(
            "version", "--format", "{{.Client.Version}}", timeout=timeout
        )
    except HostError:  # not installed (`DriverMissingError`), or no answer
        return None, False
    version = out.strip()
    if code != 0 or not version:
        return None, False
    try:
        present = (await _podman("image", "exists", image, timeout=timeout))[0] == 0
    except HostError:
        present = False
    return version, present


async def list_images() -> list[ImageInfo]:
    """Every image built by opsarena, newest first."""
    code, out, err = await _podman(
        "images", "--filter", f"label={RECIPE_LABEL}", "--format", "json"
    )
    if code != 0:
        raise HostError(f"podman images failed: {err.strip()}")
    images = []
    for row in json.loads(out or "[]"):
        names = row.get("Names") or ["<none>"]
        images.append(
            ImageInfo(
                name=names[0],
                image_id=row.get("Id", "")[:12],
                recipe=(row.get("Labels") or {}).get(RECIPE_LABEL, ""),
                size_bytes=int(row.get("Size", 0)),
                created=str(row.get("CreatedAt", "")),
            )
        )
    return images


_IMAGE_NAME_RE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"
)


def check_image_name(name: str) -> None:
    """Raise `UsageError` unless `name` is a valid image reference (`registry/path:tag`)."""
    if not _IMAGE_NAME_RE.match(name):
        raise UsageError(
            f"{name!r} is not a valid image name: use lowercase letters, digits, '.', '_', "
            "'-' and '/', with an optional ':tag' (e.g. localhost/opsarena-host:bookworm)"
        )


async def image_recipe(name: str) -> str | None:
    """The recipe hash of image `name`, or None when there is no such image."""
    code, out, _err = await _podman("image", "inspect", "--format", "json", name)
    if code != 0:
        return None
    labels = json.loads(out)[0].get("Labels") or {}
    return str(labels.get(RECIPE_LABEL, ""))


async def build_image(
    name: str = DEFAULT_IMAGE,
    *,
    force: bool = False,
    mirror: str | None = None,
    extra: tuple[str, ...] = (),
    progress: Callable[[str], None] = lambda _line: None,
) -> bool:
    """Build image `name` unless it already matches the recipe; return True if built.

    `progress` receives one line per step of the build. Raises `DriverMissingError`
    when mmdebstrap or podman is missing and `HostError` when the build fails; a
    failed build leaves the previous image (if any) in place and no files behind.
    """
    check_image_name(name)
    mirror = mirror or os.environ.get("OPSARENA_DEBIAN_MIRROR") or None
    wanted = recipe_hash(mirror=mirror, extra=extra)
    current = await image_recipe(name)
    if current == wanted and not force:
        progress(f"{name} is up to date (recipe {wanted})")
        return False
    mmdebstrap = shutil.which("mmdebstrap")
    if not mmdebstrap:
        raise DriverMissingError("mmdebstrap is not installed: run ./bootstrap")
    workdir = tempfile.mkdtemp(prefix="opsarena-image-", dir="/var/tmp")
    try:
        tarball = os.path.join(workdir, "rootfs.tar")
        packages = (*PACKAGES, *sorted(set(extra)))
        argv = [mmdebstrap, "--variant=minbase", "--include=" + ",".join(packages)]
        argv += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
        argv += ["bookworm", tarball]
        if mirror:
            argv.append(mirror)
        progress(f"building the Debian bookworm tree with mmdebstrap ({len(packages)} packages)")
        await _stream(argv, progress, BUILD_TIMEOUT)
        progress(f"importing into podman as {name}")
        args = ["import"]
        for change in (*IMPORT_CHANGES, f"LABEL {RECIPE_LABEL}={wanted}"):
            args += ["--change", change]
        code, _out, err = await _podman(*args, tarball, name, timeout=600.0)
        if code != 0:
            raise HostError(f"podman import failed: {err.strip().splitlines()[-1:]}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    with contextlib.suppress(HostError):
        await _podman("image", "prune", "--force", "--filter", f"label={RECIPE_LABEL}")
    progress(f"{name} built (recipe {wanted})")
    return True


async def _stream(argv: list[str], progress: Callable[[str], None], timeout: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail = [*tail[-9:], line]
                if line.startswith("I: "):
                    progress(line[3:])
            await proc.wait()
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise HostError(f"mmdebstrap failed ({proc.returncode}): {' | '.join(tail[-3:])}")
