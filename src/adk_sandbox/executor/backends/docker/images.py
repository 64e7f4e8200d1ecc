"""The sandbox images: where they come from, whether they are current, and how they are built.

The one place that knows the images (``BOOTSTRAP_IMAGE``, ``BASE_IMAGE``, ``RUST_IMAGE``);
``scripts/setup``, ``adk-sandbox images build`` and ``doctor`` call it. ``build_images()`` rebuilds only
what its context-hash label says changed. Depth: docs/DESIGN.md, "Images and the engine".
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

from adk_sandbox.executor.backends.docker._daemon import connect, daemon_errors, idempotent
from adk_sandbox.executor.backends.docker.config import BASE_IMAGE, RUST_IMAGE, ExpectedImage
from adk_sandbox.executor.backends.docker.engine import Engine, resolve_engine
from adk_sandbox.executor.errors import BackendUnavailableError, ExecutorError

__all__ = [
    "BASE_IMAGE",
    "BASE_IMAGE_LABEL",
    "BOOTSTRAP_IMAGE",
    "CONTEXT_HASH_LABEL",
    "REGISTRY_BASE_IMAGE",
    "RUST_DEPS_DIR",
    "RUST_IMAGE",
    "VERSION_LABEL",
    "ExpectedImage",
    "ImageBuildError",
    "ImageMismatchWarning",
    "ImagePushError",
    "ImageResult",
    "ImageSpec",
    "ImageStatus",
    "PushResult",
    "build_images",
    "check_images",
    "context_hash",
    "image_mismatch",
    "image_specs",
    "images_dir",
    "local_image_id",
    "push_images",
]

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
    from adk_sandbox.executor import __version__  # noqa: PLC0415 - executor imports the backends

    return __version__


def images_dir() -> Path:
    """The ``images/`` directory: ``$ADK_SANDBOX_IMAGES_DIR``, the checkout's, or the installed copy."""
    override = os.environ.get("ADK_SANDBOX_IMAGES_DIR")
    candidates = [Path(override)] if override else []
    package = Path(__file__).resolve().parent
    # The checkout's images/ (src/adk_sandbox/executor/backends/docker -> the repository), then the
    # wheel's copy.
    candidates += [package.parents[4] / "images", package / "images_data"]
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


# -- images on a remote engine --------------------------------------------------------------------------
PushAction = Literal["pushed", "tagged", "up to date"]
#: How often (bytes) a push reports its progress.
_PUSH_REPORT_BYTES = 16 * 1024 * 1024
#: A push's HTTP timeout: the load of a large image answers only when the whole archive is in.
PUSH_TIMEOUT_SECONDS = 1800.0


class ImagePushError(ExecutorError):
    """An image could not be copied to another engine (missing here, refused there, or arrived different)."""


class ImageMismatchWarning(UserWarning):
    """A session's container runs another image than the one this machine's engine has under that name."""


@dataclass(frozen=True)
class PushResult:
    """What :func:`push_images` did for one image."""

    name: str
    image_id: str
    action: PushAction
    """``pushed`` (saved here, loaded there), ``tagged`` (there under another name only) or ``up to date``."""
    bytes_sent: int
    seconds: float


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def push_images(
    target: Engine | str,
    names: list[str] | None = None,
    *,
    progress: Progress = lambda _line: None,
    source: Engine | str | None = None,
) -> list[PushResult]:
    """Copy images to the engine ``target`` without a registry: ``docker save`` here streamed into its load.

    ``target`` is an :class:`Engine`, a URL or a Docker context name (as :func:`resolve_engine` takes);
    ``names`` default to the project's images (:func:`image_specs`); ``source`` is the engine they are read
    from (default: the environment's). An image the target already has with the same id is skipped (or
    only tagged when it is there under another name). ``progress`` gets ``==> `` milestones and
    ``<name>: N MB sent`` lines. After a load the target's id must equal the source's (an image id is
    the digest of its configuration, so equal ids mean the same image), else :class:`ImagePushError`.
    """
    wanted = names or [spec.tag for spec in image_specs()]
    destination = resolve_engine(target)
    source_client = connect(timeout=PUSH_TIMEOUT_SECONDS, engine=source)
    try:
        target_client = connect(timeout=PUSH_TIMEOUT_SECONDS, engine=destination)
        try:
            return [_push_one(source_client, target_client, destination, name, progress) for name in wanted]
        finally:
            target_client.close()
    finally:
        source_client.close()


def _push_one(
    source: docker.DockerClient, target: docker.DockerClient, engine: Engine, name: str, progress: Progress
) -> PushResult:
    started = time.monotonic()
    attrs = _image_attrs(source, name)
    if attrs is None:
        raise ImagePushError(
            f"there is no image {name!r} on this machine's engine to push; build it first "
            "(adk-sandbox images build) or name an image `docker images` lists"
        )
    image_id = str(attrs["Id"])
    there = _image_attrs(target, name)
    if there is not None and there["Id"] == image_id:
        progress(f"==> {name}: up to date on {engine.describe()} ({_short(image_id)})")
        return PushResult(name, image_id, "up to date", 0, time.monotonic() - started)
    if _image_attrs(target, image_id) is not None:
        _tag(target, image_id, name)
        progress(f"==> {name}: already on {engine.describe()} under another name; tagged it")
        return PushResult(name, image_id, "tagged", 0, time.monotonic() - started)
    size = int(attrs.get("Size") or 0)
    progress(f"==> {name}: pushing {_short(image_id)} ({size / 1e6:.0f} MB unpacked) to {engine.describe()}")
    sent = 0

    def archive() -> Iterator[bytes]:
        nonlocal sent
        reported = 0
        with daemon_errors():
            for chunk in source.api.get_image(name):
                sent += len(chunk)
                if sent - reported >= _PUSH_REPORT_BYTES:
                    reported = sent
                    progress(f"{name}: {sent / 1e6:.0f} MB sent")
                yield chunk

    try:
        with daemon_errors():
            events = target.api.load_image(archive(), quiet=True)  # type: ignore[no-untyped-call]
            for event in events or ():
                if isinstance(event, dict) and event.get("error"):
                    raise ImagePushError(f"{engine.describe()} refused the image {name}: {event['error']}")
    except ImagePushError:
        raise
    except ExecutorError as exc:
        raise ImagePushError(
            f"pushing {name} to {engine.describe()} failed after {sent} bytes: {exc}"
        ) from exc
    loaded = _image_attrs(target, name)
    if loaded is None or loaded["Id"] != image_id:
        found = _short(str(loaded["Id"])) if loaded else "nothing"
        raise ImagePushError(
            f"after loading {name} into {engine.describe()} it names {found}, not {_short(image_id)}"
        )
    seconds = time.monotonic() - started
    progress(f"==> {name}: pushed {_short(image_id)} ({sent / 1e6:.1f} MB sent) in {seconds:.1f} s")
    return PushResult(name, image_id, "pushed", sent, seconds)


def local_image_id(name: str, timeout: float = 5.0) -> str | None:
    """The id of ``name`` on this machine's engine (the default Unix socket); None without one or the image.

    A remote backend compares its containers' image with it (:func:`image_mismatch`); a machine without a
    local engine, or one that does not answer within ``timeout``, just has nothing to compare with.
    """
    local = Engine()
    if local.socket_path is None or not os.path.exists(local.socket_path):
        return None
    try:
        client = connect(timeout=timeout, engine=local)
    except ExecutorError:
        return None
    try:
        attrs = _image_attrs(client, name)
    except ExecutorError:
        return None
    finally:
        client.close()
    return str(attrs["Id"]) if attrs else None


def image_mismatch(inspect: Mapping[str, Any], reference: str, expected: ExpectedImage) -> str | None:
    """Why the container of ``inspect`` does not run the expected image (a sentence), or None when it does."""
    running = str(inspect.get("Image") or "")
    if running.removeprefix("sha256:") == expected.image_id.removeprefix("sha256:"):
        return None
    where = "the pinned image_id" if expected.pinned else "what this machine's engine has under that name"
    fix = (
        "push the image you meant (adk-sandbox images push --engine ENGINE IMAGE) or pin the engine's id"
        if expected.pinned
        else "run `adk-sandbox images push --engine ENGINE` to make them equal, or pin an id (image_id=)"
    )
    return (
        f"the sandbox container runs image {_short(running) or '(unknown)'} for {reference!r}, not "
        f"{_short(expected.image_id)} ({where}); {fix}"
    )
