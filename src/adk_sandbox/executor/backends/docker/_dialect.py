"""Which kind of engine answers on the Docker API, and what the Podman dialect changes.

:func:`dialect_of` recognises the engine once per client; :func:`podman_host_config` adjusts the create
arguments and :func:`podman_view` reads podman's ``inspect`` into the shape the Docker checks read,
listing its deviations. The Docker dialect goes through neither. Depth: docs/docker/engines.md, "Podman".
"""

from __future__ import annotations

import copy
import enum
import json
import resource
import weakref
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import docker
from docker.types import Ulimit

from adk_sandbox.executor.backends.docker._daemon import engine_of, idempotent
from adk_sandbox.executor.backends.docker._seccomp import PROFILE_FILE, load_profile
from adk_sandbox.executor.errors import PolicyNotEnforceableError

__all__ = ["PODMAN_ADDED_TMPFS", "Dialect", "PodmanView", "dialect_of", "podman_host_config", "podman_view"]


class Dialect(enum.StrEnum):
    """The kind of engine behind a Docker API socket."""

    DOCKER = "docker"
    PODMAN = "podman"


#: tmpfs mounts podman adds to every container by itself.
PODMAN_ADDED_TMPFS = ("/run", "/var/tmp")
#: Options podman appends to every tmpfs it reports (propagation, copy-up of the image's content).
_PODMAN_TMPFS_SUFFIXES = ("rprivate", "tmpcopyup")
#: RLIMIT_NPROC for a podman container. Podman's default (the kernel's maximum) fails where the engine
#: cannot raise its own hard limit (no CAP_SYS_RESOURCE); the count is per uid across the host, so it
#: is generous: the container's own bound is its pids limit.
PODMAN_NPROC = 16384

_dialects: weakref.WeakKeyDictionary[docker.DockerClient, Dialect] = weakref.WeakKeyDictionary()


def dialect_of(client: docker.DockerClient) -> Dialect:
    """The dialect of the engine ``client`` talks to, from its version components (asked once)."""
    known = _dialects.get(client)
    if known is not None:
        return known
    version = idempotent(client.version)
    names = [str(component.get("Name", "")) for component in version.get("Components") or []]
    dialect = Dialect.PODMAN if any(name.startswith("Podman") for name in names) else Dialect.DOCKER
    _dialects[client] = dialect
    return dialect


def _profile_path() -> Path:
    """The sandbox seccomp profile as a file of this machine (podman reads it by path)."""
    path = Path(str(resources.files(__package__).joinpath("seccomp", PROFILE_FILE)))
    if not path.is_file():  # pragma: no cover - an installation without its data files
        raise PolicyNotEnforceableError(
            f"the sandbox seccomp profile {path} is missing from the installation"
        )
    return path


def podman_host_config(client: docker.DockerClient, arguments: dict[str, Any]) -> dict[str, Any]:
    """``create_host_config`` arguments (the Docker dialect's) changed for podman.

    The seccomp profile goes by path, so the engine must be on this machine: a remote podman is refused.
    ``nproc`` is given (podman's default fails here, see :data:`PODMAN_NPROC`), at most this process's
    own hard limit.
    """
    engine = engine_of(client)
    if not engine.local:
        raise PolicyNotEnforceableError(
            f"the engine {engine.describe()} is Podman on another machine: podman takes the sandbox's "
            "seccomp profile only as a path on its own machine, so it cannot be applied there. Use a local "
            "podman socket (podman system service unix://...) or a Docker engine"
        )
    changed = dict(arguments)
    changed["security_opt"] = [
        f"seccomp={_profile_path()}" if option.startswith("seccomp=") else option
        for option in arguments["security_opt"]
    ]
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = PODMAN_NPROC if hard == resource.RLIM_INFINITY else min(PODMAN_NPROC, hard)
    changed["ulimits"] = [*arguments["ulimits"], Ulimit(name="nproc", soft=nproc, hard=nproc)]
    return changed


class PodmanView:
    """A podman container's inspect in the shape the Docker checks read, and what differed."""

    def __init__(self, inspect: Mapping[str, Any], deviations: tuple[str, ...]) -> None:
        self.inspect = inspect
        self.deviations = deviations


def podman_view(client: docker.DockerClient, inspect: Mapping[str, Any]) -> PodmanView:
    """Read libpod's inspect (and the runtime's OCI configuration) to normalise ``inspect``.

    Anything that cannot be confirmed is left as podman reported it, so the Docker checks then name it.
    """
    container_id = str(inspect["Id"])
    api: Any = client.api  # docker-py's own request helpers (_result is untyped there)
    libpod: dict[str, Any] = idempotent(
        lambda: api._result(api.get(f"{api.base_url}/v4.0.0/libpod/containers/{container_id}/json"), True)
    )
    view = copy.deepcopy(dict(inspect))
    host: dict[str, Any] = view.setdefault("HostConfig", {})
    deviations: list[str] = []

    reported_drop = [str(cap) for cap in host.get("CapDrop") or []]
    no_caps = not libpod.get("BoundingCaps") and not libpod.get("EffectiveCaps")
    if "ALL" not in [cap.upper() for cap in reported_drop] and reported_drop and no_caps:
        host["CapDrop"] = ["ALL"]
        deviations.append(
            f"CapDrop is reported as the default list ({len(reported_drop)} capabilities), not ALL: counted "
            "as all because libpod reports no bounding or effective capability (CapBnd and CapEff are "
            "checked to be 0 from inside)"
        )

    runtime = str(libpod.get("OCIRuntime") or host.get("Runtime") or "")
    if runtime != host.get("Runtime"):
        deviations.append(
            f"HostConfig.Runtime is reported as {host.get('Runtime')!r}; libpod's OCIRuntime is {runtime!r}"
        )
        host["Runtime"] = runtime

    options = list(host.get("SecurityOpt") or [])
    for index, option in enumerate(options):
        key, _, value = option.partition("=")
        if key == "seccomp" and value.startswith("/") and _file_holds_sandbox_profile(value):
            options[index] = "seccomp=" + json.dumps(load_profile())
            deviations.append(f"the seccomp profile is given by path ({value}), which holds the sandbox's")
    host["SecurityOpt"] = options

    masked = _oci_masked_paths(libpod)
    if masked is not None and not host.get("MaskedPaths") and not host.get("ReadonlyPaths"):
        host["MaskedPaths"], host["ReadonlyPaths"] = masked
        deviations.append(
            "MaskedPaths/ReadonlyPaths are not in the inspect: read from the runtime's OCI config"
        )

    tmpfs = {path: _strip_suffixes(options_text) for path, options_text in (host.get("Tmpfs") or {}).items()}
    host["Tmpfs"] = tmpfs
    added = [path for path in PODMAN_ADDED_TMPFS if path in tmpfs]
    if added:
        deviations.append(
            f"podman adds tmpfs {', '.join(added)} by itself (unsized: their pages count against the "
            "memory limit)"
        )

    if (libpod.get("HostConfig") or {}).get("CgroupMode") == "host":
        # Reported, not refused: the container's cgroup mount is still its own cgroup only.
        deviations.append(
            "the container shares the host's cgroup namespace (podman on cgroup v1 ignores cgroupns "
            "private): /proc/self/cgroup names the host path of its own cgroup; /sys/fs/cgroup shows only "
            "that cgroup"
        )
    deviations.append("State.OOMKilled is never set by podman: OOM kills are counted in the memory cgroup")
    return PodmanView(view, tuple(deviations))


def _file_holds_sandbox_profile(path: str) -> bool:
    try:
        return bool(json.loads(Path(path).read_text()) == load_profile())
    except (OSError, ValueError):
        return False


def _oci_masked_paths(libpod: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """The masked and read-only paths of the runtime's OCI config (a file of the local engine's)."""
    path = libpod.get("OCIConfigPath")
    if not path:
        return None
    try:
        linux = json.loads(Path(str(path)).read_text()).get("linux") or {}
    except (OSError, ValueError):
        return None
    return list(linux.get("maskedPaths") or []), list(linux.get("readonlyPaths") or [])


def _strip_suffixes(options: str) -> str:
    return ",".join(part for part in options.split(",") if part not in _PODMAN_TMPFS_SUFFIXES)
