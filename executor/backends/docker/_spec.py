"""What a sandbox container looks like: the create arguments, and the reading of ``docker inspect``.

Both directions are pure functions of data, unit-tested as tables: :func:`host_config_arguments` says
what is asked of the daemon; :func:`hardening_violations` and :func:`capabilities_from_inspect` say what
the running container really has. Isolation is reported from the second, never from the first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from docker.types import LogConfig, Mount, Ulimit

from executor.policy import AllowedPath
from executor.types import Capabilities, IsolationClass, Language, ResourceLimits

__all__ = [
    "GVISOR_RUNTIME",
    "HOME_DIR",
    "LABEL_PREFIX",
    "PROJECT_LABEL",
    "ContainerSpec",
    "capabilities_from_inspect",
    "git_protection_mounts",
    "hardening_violations",
    "host_config_arguments",
    "isolation_of",
]

GVISOR_RUNTIME = "runsc"
HOME_DIR = "/home/sandbox"
LABEL_PREFIX = "io.adk-sandbox."
#: Every container this project creates carries this label; cleanup selects by it, never by name.
PROJECT_LABEL = LABEL_PREFIX + "project"

MIB = 1024 * 1024


@dataclass(frozen=True)
class ContainerSpec:
    """Everything that decides how a session container is created."""

    image: str
    limits: ResourceLimits
    runtime: str | None = None
    network: bool = False
    workspace: str | None = None
    """Host path bind-mounted read-write at the same path, and the commands' cwd."""
    extra_mounts: tuple[AllowedPath, ...] = ()
    """Further host paths (from a policy) mounted at the same path with their mode."""
    read_only_mounts: tuple[str, ...] = ()
    """Host paths mounted read-only over the workspace mount (``.git/hooks``, ``.git/config``)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    lifetime_seconds: int = 12 * 3600

    @property
    def workdir(self) -> str:
        """Where commands start: the workspace, else the scratch tmpfs."""
        return self.workspace or "/tmp"


def git_protection_mounts(workspace: str) -> tuple[str, ...]:
    """``.git/hooks`` and ``.git/config`` of ``workspace`` when they exist as real files or directories.

    Code planted there would later run on the host (a hook, or ``core.fsmonitor`` in the config), so the
    container sees them read-only. A symlinked entry is left alone: its target is not in the container.
    """
    found = []
    for relative in (".git/hooks", ".git/config"):
        path = os.path.join(workspace, relative)
        if os.path.lexists(path) and not os.path.islink(path) and not os.path.islink(os.path.dirname(path)):
            found.append(path)
    return tuple(found)


def tmpfs_options(limits: ResourceLimits) -> str:
    """Options of the writable tmpfs mounts: executable (build tools run from /tmp), bounded in size."""
    return f"rw,exec,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"


def host_config_arguments(spec: ContainerSpec) -> dict[str, Any]:
    """Keyword arguments for docker-py's ``create_host_config`` (the hardened defaults of SPEC §4)."""
    mounts = []
    if spec.workspace:
        mounts.append(Mount(target=spec.workspace, source=spec.workspace, type="bind", read_only=False))
    for allowed in spec.extra_mounts:
        read_only = allowed.mode == "read_only"
        mounts.append(Mount(target=allowed.path, source=allowed.path, type="bind", read_only=read_only))
    for path in spec.read_only_mounts:
        mounts.append(Mount(target=path, source=path, type="bind", read_only=True))
    limits = spec.limits
    memory = limits.memory_mb * MIB
    return {
        "network_mode": "bridge" if spec.network else "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": tmpfs_options(limits), HOME_DIR: tmpfs_options(limits)},
        "init": True,
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "ulimits": [
            Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=limits.file_size_mb * MIB, hard=limits.file_size_mb * MIB),
        ],
        "log_config": LogConfig(type="none"),
        "mounts": mounts,
        "runtime": spec.runtime,
        # A leaked container removes itself once its keeper process ends (see the session's lifetime).
        "auto_remove": True,
    }


def isolation_of(inspect: Mapping[str, Any]) -> IsolationClass:
    """The class of a running container: gVisor when its runtime is runsc, else a plain container."""
    runtime = inspect.get("HostConfig", {}).get("Runtime") or ""
    return IsolationClass.GVISOR if runtime == GVISOR_RUNTIME else IsolationClass.CONTAINER


def hardening_violations(
    inspect: Mapping[str, Any],
    *,
    network: bool = False,
    runtime: str | None = None,
    limits: ResourceLimits | None = None,
    mounts: Sequence[str] = (),
) -> list[str]:
    """What the inspected container lacks of the hardening asked for (empty when all is in force).

    ``limits`` None means "any limit, but some limit" (attach mode: the compose file chose the values).
    ``mounts`` are the host paths allowed as bind-mount sources; any other host mount is a violation.
    """
    host = inspect.get("HostConfig") or {}
    problems: list[str] = []

    def want(condition: bool, problem: str) -> None:
        if not condition:
            problems.append(problem)

    want(bool(inspect.get("State", {}).get("Running")), "the container is not running")
    if not network:
        want(host.get("NetworkMode") == "none", f"network is {host.get('NetworkMode')!r}, not 'none'")
    want(not host.get("Privileged"), "the container is privileged")
    want("ALL" in [cap.upper() for cap in host.get("CapDrop") or []], "capabilities are not all dropped")
    want(not host.get("CapAdd"), f"capabilities are added: {host.get('CapAdd')}")
    options = [option.replace(":", "=") for option in host.get("SecurityOpt") or []]
    want(
        any(option in ("no-new-privileges", "no-new-privileges=true") for option in options),
        "no-new-privileges is not set",
    )
    want("seccomp=unconfined" not in options, "the seccomp profile is disabled")
    want(bool(host.get("ReadonlyRootfs")), "the root filesystem is writable")
    for namespace in ("PidMode", "IpcMode", "UTSMode", "UsernsMode"):
        want(host.get(namespace) != "host", f"{namespace} shares the host's namespace")
    want(not host.get("Devices"), f"host devices are mapped in: {host.get('Devices')}")
    if runtime is not None:
        want(host.get("Runtime") == runtime, f"runtime is {host.get('Runtime')!r}, not {runtime!r}")
    if limits is None:
        want((host.get("Memory") or 0) > 0, "no memory limit")
        want((host.get("PidsLimit") or 0) > 0, "no pids limit")
    else:
        memory = limits.memory_mb * MIB
        want(host.get("Memory") == memory, f"memory limit is {host.get('Memory')}, not {memory}")
        want(host.get("MemorySwap") == memory, f"memory+swap is {host.get('MemorySwap')}, not {memory}")
        want(host.get("PidsLimit") == limits.pids, f"pids limit is {host.get('PidsLimit')}")
        want(host.get("NanoCpus") == int(limits.cpus * 1e9), f"cpu limit is {host.get('NanoCpus')} nanocpus")
    allowed = set(mounts)
    for mount in inspect.get("Mounts") or []:
        if mount.get("Type") == "bind" and mount.get("Source") not in allowed:
            problems.append(f"unexpected host mount {mount.get('Source')} -> {mount.get('Destination')}")
    return problems


def capabilities_from_inspect(inspect: Mapping[str, Any], languages: tuple[Language, ...]) -> Capabilities:
    """What a running container enforces, read from its inspected configuration."""
    host = inspect.get("HostConfig") or {}
    return Capabilities(
        isolation=isolation_of(inspect),
        timeout=True,
        memory=(host.get("Memory") or 0) > 0,
        cpu=(host.get("NanoCpus") or 0) > 0 or (host.get("CpuQuota") or 0) > 0,
        pids=(host.get("PidsLimit") or 0) > 0,
        network=host.get("NetworkMode") == "none",
        # The container sees its image and the mounts checked by hardening_violations, nothing else.
        fs_read=True,
        fs_write=bool(host.get("ReadonlyRootfs")),
        env=True,
        languages=languages,
    )
