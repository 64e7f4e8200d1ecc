"""The sandbox images: where they come from, whether they are current, and how they are built.

This module is the ONE place that knows about the images (``scripts/setup``, ``adk-sandbox images build``
and ``doctor`` all call it)::

    adk-sandbox/debian:trixie   BOOTSTRAP_IMAGE  debootstrap + docker import (images/bootstrap), no registry
          |   (or debian:trixie-slim from a registry, or any --base-image)
    adk-sandbox/base:latest     BASE_IMAGE       images/base   bash, coreutils, git, python3, ps, setsid, ...
          |
    adk-sandbox/rust:latest     RUST_IMAGE       images/rust   rustc, cargo, serde_json rlibs (/opt/rust-deps)

Each built image also gets the project version as a tag and carries the label ``io.adk-sandbox.context-hash``:
a sha256 of its build context (every file in its directory), its build arguments and the **ID** of the
image it is built on. An image is *current* when it exists and that label equals the hash computed now, so
``build_images()`` rebuilds exactly what changed (a rebuilt base makes the rust image outdated) and is a
fast no-op otherwise.

Choosing the Debian base when no ``base_image`` is given: the bootstrap image if it exists, else
``debian:trixie-slim`` if it exists locally, else a pull of ``debian:trixie-slim`` (bounded in time), else
the bootstrap script makes the bootstrap image (needs root on Debian; no registry needed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
import docker.utils

from executor.backends.docker._daemon import connect, daemon_errors, idempotent
from executor.errors import BackendUnavailableError, ExecutorError

__all__ = [
    "BASE_IMAGE",
    "BASE_IMAGE_LABEL",
    "BOOTSTRAP_IMAGE",
    "CONTEXT_HASH_LABEL",
    "REGISTRY_BASE_IMAGE",
    "RUST_DEPS_DIR",
    "RUST_IMAGE",
    "VERSION_LABEL",
    "ImageBuildError",
    "ImageResult",
    "ImageSpec",
    "ImageStatus",
    "build_images",
    "check_images",
    "context_hash",
    "image_specs",
    "images_dir",
]

BASE_IMAGE = "adk-sandbox/base:latest"
RUST_IMAGE = "adk-sandbox/rust:latest"
BOOTSTRAP_IMAGE = "adk-sandbox/debian:trixie"
REGISTRY_BASE_IMAGE = "debian:trixie-slim"
RUST_DEPS_DIR = "/opt/rust-deps"
"""Directory of the rust image holding the serde_json rlib (``libserde_json.rlib``) and its dependencies."""

CONTEXT_HASH_LABEL = "io.adk-sandbox.context-hash"
BASE_IMAGE_LABEL = "io.adk-sandbox.base-image"
VERSION_LABEL = "io.adk-sandbox.version"

PULL_TIMEOUT_SECONDS = 20.0
"""How long a silent registry may keep a pull waiting before the bootstrap is used instead."""

Progress = Callable[[str], None]
Action = Literal["up to date", "built"]
State = Literal["current", "outdated", "missing"]
_UP_TO_DATE: Action = "up to date"
_BUILT: Action = "built"
_CURRENT: State = "current"
_OUTDATED: State = "outdated"


class ImageBuildError(ExecutorError):
    """An image could not be built. The message is one line; ``output`` has the last lines of the build."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class ImageSpec:
    """One image this project builds from a directory of ``images/``."""

    name: str
    """Short name, also the directory under ``images/``: ``base`` or ``rust``."""
    repository: str
    """``adk-sandbox/base``; tagged ``:latest`` and ``:<project version>``."""
    context: Path

    @property
    def tag(self) -> str:
        """The ``:latest`` tag everything refers to."""
        return f"{self.repository}:latest"

    @property
    def version_tag(self) -> str:
        """The tag naming the project version that built it."""
        return f"{self.repository}:{_version()}"


@dataclass(frozen=True)
class ImageResult:
    """What :func:`build_images` did for one image."""

    name: str
    tag: str
    action: Action
    image_id: str
    seconds: float
    built_on: str
    """The image (name) it was built on."""


@dataclass(frozen=True)
class ImageStatus:
    """What :func:`check_images` found for one image."""

    name: str
    tag: str
    state: State
    detail: str


def _version() -> str:
    from executor import __version__  # noqa: PLC0415 - executor imports the backends

    return __version__


def images_dir() -> Path:
    """The ``images/`` directory: ``$ADK_SANDBOX_IMAGES_DIR``, the checkout's, or the installed copy."""
    override = os.environ.get("ADK_SANDBOX_IMAGES_DIR")
    candidates = [Path(override)] if override else []
    package = Path(__file__).resolve().parent
    candidates += [package.parents[2] / "images", package / "images_data"]
    for candidate in candidates:
        if (candidate / "base" / "Dockerfile").is_file():
            return candidate
    raise ImageBuildError(
        f"cannot find the images/ directory (looked in {', '.join(map(str, candidates))}); "
        "set ADK_SANDBOX_IMAGES_DIR to a checkout's images/"
    )


def image_specs(root: Path | None = None) -> list[ImageSpec]:
    """The images in build order (each built on the previous one)."""
    root = root or images_dir()
    return [
        ImageSpec("base", BASE_IMAGE.rsplit(":", 1)[0], root / "base"),
        ImageSpec("rust", RUST_IMAGE.rsplit(":", 1)[0], root / "rust"),
    ]


def _context_files(context: Path) -> Iterator[Path]:
    for path in sorted(context.rglob("*")):
        relative = path.relative_to(context)
        if any(part == "__pycache__" or part.startswith(".#") for part in relative.parts):
            continue
        if path.is_file() or path.is_symlink():
            yield path


def context_hash(context: Path, build_args: Mapping[str, str], base_image_id: str) -> str:
    """sha256 of a build context: every file (path, mode, content), the build arguments, the base's ID.

    Equal hashes mean ``docker build`` would produce the same image (up to what apt downloads), so an
    image labelled with the current hash is not rebuilt.
    """
    digest = hashlib.sha256()
    digest.update(b"adk-sandbox image context v1\0")
    for path in _context_files(context):
        relative = path.relative_to(context).as_posix()
        if path.is_symlink():
            data = b"symlink:" + os.readlink(path).encode()
            executable = False
        else:
            data = path.read_bytes()
            executable = bool(path.stat().st_mode & 0o111)
        digest.update(f"file\0{relative}\0{int(executable)}\0{len(data)}\0".encode())
        digest.update(data)
    for key in sorted(build_args):
        digest.update(f"arg\0{key}={build_args[key]}\0".encode())
    digest.update(f"base\0{base_image_id}\0".encode())
    return digest.hexdigest()


# -- the engine -----------------------------------------------------------------------------------------


# Every docker-py call below goes through _daemon's error mapping (idempotent() or daemon_errors()), so
# only this library's exceptions leave the module (and the CLI prints one line, not a traceback).


def _image_attrs(client: docker.DockerClient, name: str) -> dict[str, Any] | None:
    """``docker image inspect``; None when there is no such image."""

    def inspect() -> dict[str, Any] | None:
        try:
            attrs: dict[str, Any] = client.api.inspect_image(name)  # type: ignore[no-untyped-call]
        except docker.errors.ImageNotFound:
            return None
        return attrs

    return idempotent(inspect)


def _tag(client: docker.DockerClient, image_id: str, reference: str) -> None:
    """Tag ``image_id`` as ``reference`` (``repository:tag``); repeating it is harmless."""
    repository, _, tag = reference.rpartition(":")
    try:
        idempotent(lambda: client.api.tag(image_id, repository, tag))
    except ExecutorError as exc:
        raise ImageBuildError(f"tagging {image_id[7:19] or image_id} as {reference} failed: {exc}") from exc


def _labels(attrs: Mapping[str, Any]) -> dict[str, str]:
    config = attrs.get("Config") or {}
    return dict(config.get("Labels") or {})


def _pull(client: docker.DockerClient, name: str, progress: Progress) -> bool:
    """Try to pull ``name`` from a registry within bounded time; False when no registry answers."""
    repository, tag = docker.utils.parse_repository_tag(name)
    # The one kind of connection (_daemon.connect: the local socket, no proxy or CA settings from the
    # environment), with its own shorter timeout for a registry that does not answer.
    pull_client = connect(timeout=PULL_TIMEOUT_SECONDS)
    progress(f"==> registry: trying `docker pull {name}`")
    try:
        with daemon_errors():
            for event in pull_client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                if "error" in event:
                    progress(f"registry: {event['error']}")
                    return False
                status = " ".join(str(event.get(key, "")) for key in ("id", "status", "progress")).strip()
                if status:
                    progress(f"registry: {status}")
    except ExecutorError as exc:
        progress(f"registry: not reachable ({(str(exc).splitlines() or [type(exc).__name__])[0]})")
        return False
    finally:
        pull_client.close()
    return _image_attrs(client, name) is not None


def _bootstrap(root: Path, tag: str, progress: Progress) -> None:
    script = root / "bootstrap" / "bootstrap.sh"
    progress(f"==> bootstrap: no registry; making {tag} with {script}")
    with subprocess.Popen(
        ["bash", str(script), tag],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        tail: list[str] = []
        for raw in proc.stdout or ():
            line = raw.rstrip("\n")
            tail = [*tail[-19:], line]
            progress(f"bootstrap: {line}")
        code = proc.wait()
    if code != 0:
        raise ImageBuildError(
            f"bootstrapping {tag} failed (exit {code}): {tail[-1] if tail else 'no output'}; "
            f"pass --base-image IMAGE to build on an image you have",
            output="\n".join(tail),
        )


def _resolve_debian_base(
    client: docker.DockerClient, base_image: str | None, root: Path, bootstrap_image: str, progress: Progress
) -> str:
    """The image ``images/base`` is built on (see the module docstring for the order)."""
    if base_image:
        if _image_attrs(client, base_image) is None and not _pull(client, base_image, progress):
            raise ImageBuildError(f"base image {base_image!r} is not present and cannot be pulled")
        return base_image
    for candidate in (bootstrap_image, REGISTRY_BASE_IMAGE):
        if _image_attrs(client, candidate) is not None:
            return candidate
    if _pull(client, REGISTRY_BASE_IMAGE, progress):
        return REGISTRY_BASE_IMAGE
    _bootstrap(root, bootstrap_image, progress)
    return bootstrap_image


def _build(
    client: docker.DockerClient,
    spec: ImageSpec,
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    progress: Progress,
    *,
    nocache: bool = False,
) -> str:
    """``docker build --network host`` of one context (``nocache``: no layer cache); the new image's ID."""
    image_id = ""
    tail: list[str] = []
    try:
        with daemon_errors():
            stream = client.api.build(
                path=str(spec.context),
                tag=spec.tag,
                buildargs=dict(build_args),
                labels=dict(labels),
                network_mode="host",
                decode=True,
                rm=True,
                forcerm=True,
                pull=False,
                nocache=nocache,
            )
            for event in stream:
                if "error" in event:
                    detail = " ".join(str(event["error"]).split())
                    raise ImageBuildError(
                        f"building {spec.tag} failed: {detail}", output="\n".join(tail[-20:])
                    )
                if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
                    image_id = str(event["aux"]["ID"])
                text = str(event.get("stream") or event.get("status") or "")
                for line in text.splitlines():
                    if line.strip():
                        tail = [*tail[-30:], line.rstrip()]
                        progress(f"{spec.name}: {line.rstrip()}")
    except (ImageBuildError, BackendUnavailableError):
        raise
    except (ExecutorError, OSError) as exc:  # the daemon refused or broke off; an unreadable context file
        detail = " ".join(str(exc).split())
        raise ImageBuildError(f"building {spec.tag} failed: {detail}", output="\n".join(tail[-20:])) from exc
    attrs = _image_attrs(client, spec.tag)
    if attrs is None:
        raise ImageBuildError(f"building {spec.tag} reported success but the image is missing")
    return image_id or str(attrs["Id"])


def _remove_replaced(client: docker.DockerClient, name: str, image_id: str, progress: Progress) -> None:
    """Remove the image a rebuild replaced when nothing uses it any more (the rust image is ~1 GB)."""
    attrs = _image_attrs(client, image_id)
    if attrs is None or attrs.get("RepoTags") or not _labels(attrs).get(CONTEXT_HASH_LABEL):
        return  # gone, still tagged elsewhere, or not one of ours
    try:
        with daemon_errors():
            client.api.remove_image(image_id, noprune=False)
    except ExecutorError:
        return  # a container (or a child image) still uses it; `docker image prune` can take it later
    progress(f"==> {name}: removed the image it replaced ({image_id[7:19]})")


def build_images(
    *,
    base_image: str | None = None,
    progress: Progress = lambda _line: None,
    force: bool = False,
    root: Path | None = None,
    tag_prefix: str | None = None,
) -> list[ImageResult]:
    """Build the images that are missing or outdated (all of them with ``force``), in order.

    ``base_image`` is the Debian image ``images/base`` is built on (default: see the module docstring).
    ``progress`` gets every output line, prefixed by the image name (``base: Step 2/5 : RUN ...``);
    milestones (building, built, up to date, bootstrapping) start with ``==> ``.
    ``root`` and ``tag_prefix`` (e.g. ``adk-sandbox-test`` instead of ``adk-sandbox``, also for the
    bootstrap image) exist for tests.
    Raises :class:`ImageBuildError` (with the failing output) or ``BackendUnavailableError`` (no daemon).
    """
    root = root or images_dir()
    client = connect(timeout=600)
    try:
        specs = image_specs(root)
        if tag_prefix:
            specs = [ImageSpec(s.name, f"{tag_prefix}/{s.name}", s.context) for s in specs]
        results: list[ImageResult] = []
        bootstrap_image = f"{tag_prefix}/debian:trixie" if tag_prefix else BOOTSTRAP_IMAGE
        parent = _resolve_debian_base(client, base_image, root, bootstrap_image, progress)
        for spec in specs:
            started = time.monotonic()
            parent_attrs = _image_attrs(client, parent)
            if parent_attrs is None:
                raise ImageBuildError(f"{spec.tag} is built on {parent}, which does not exist")
            build_args = {"BASE_IMAGE": parent}
            wanted = context_hash(spec.context, build_args, str(parent_attrs["Id"]))
            attrs = _image_attrs(client, spec.tag)
            if not force and attrs is not None and _labels(attrs).get(CONTEXT_HASH_LABEL) == wanted:
                image_id, action = str(attrs["Id"]), _UP_TO_DATE
                progress(f"==> {spec.name}: {spec.tag} is up to date")
            else:
                why = "forced" if force and attrs else ("missing" if attrs is None else "outdated")
                progress(f"==> {spec.name}: building {spec.tag} on {parent} ({why})")
                labels = {CONTEXT_HASH_LABEL: wanted, BASE_IMAGE_LABEL: parent, VERSION_LABEL: _version()}
                image_id, action = _build(client, spec, build_args, labels, progress, nocache=force), _BUILT
            version_attrs = _image_attrs(client, spec.version_tag)
            if version_attrs is None or version_attrs["Id"] != image_id:
                _tag(client, image_id, spec.version_tag)
            if attrs is not None and attrs["Id"] != image_id:
                _remove_replaced(client, spec.name, str(attrs["Id"]), progress)
            seconds = time.monotonic() - started
            results.append(ImageResult(spec.name, spec.tag, action, image_id, seconds, parent))
            if action == "built":
                progress(f"==> {spec.name}: built {spec.tag} ({image_id[7:19]}) in {seconds:.1f} s")
            parent = spec.tag
        return results
    finally:
        client.close()


def check_images(root: Path | None = None) -> list[ImageStatus]:
    """Each image's state (current / outdated / missing) without building or pulling anything."""
    root = root or images_dir()
    client = connect(timeout=30)
    statuses: list[ImageStatus] = []
    try:
        for spec in image_specs(root):
            attrs = _image_attrs(client, spec.tag)
            if attrs is None:
                statuses.append(ImageStatus(spec.name, spec.tag, "missing", "run: adk-sandbox images build"))
                continue
            labels = _labels(attrs)
            parent = labels.get(BASE_IMAGE_LABEL, "")
            parent_attrs = _image_attrs(client, parent) if parent else None
            short = str(attrs["Id"])[7:19]
            if parent_attrs is None:
                state, detail = _OUTDATED, f"{short}; its base {parent or '(unknown)'} is gone"
            else:
                wanted = context_hash(spec.context, {"BASE_IMAGE": parent}, str(parent_attrs["Id"]))
                current = labels.get(CONTEXT_HASH_LABEL) == wanted
                state = _CURRENT if current else _OUTDATED
                detail = f"{short}, built on {parent}"
            if state == "outdated":
                detail += "; run: adk-sandbox images build"
            statuses.append(ImageStatus(spec.name, spec.tag, state, detail))
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return statuses
