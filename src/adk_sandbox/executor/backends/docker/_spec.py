"""What a sandbox container looks like: the create arguments, and the reading of ``docker inspect``.

Both directions are pure functions of data, unit-tested as tables: :func:`host_config_arguments` says
what is asked of the daemon; :func:`hardening_violations` and :func:`capabilities_from_inspect` say what
the running container really has. Isolation is reported from the second, never from the first.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from adk_sandbox.executor._layout import AGENT_MOUNT, DIRECT_MOUNT, HOME_DIR, KERNEL_PATHS
from adk_sandbox.executor._mountinfo import MountEntry, top_mounts
from adk_sandbox.executor._owner import LABEL_PREFIX, PROJECT_LABEL
from adk_sandbox.executor.backends.docker._seccomp import load_profile, profile_option, seccomp_profile_of
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError, validation_problems
from adk_sandbox.executor.policy import AllowedPath
from adk_sandbox.executor.types import Capabilities, IsolationClass, Language, ResourceLimits

if TYPE_CHECKING:  # docker-py is imported where mounts are made: DockerConfig's checks load without it
    from docker.types import Mount

__all__ = [
    "GVISOR_RUNTIME",
    "HOME_DIR",
    "KEEPER_CAPABILITIES",
    "LABEL_PREFIX",
    "PROJECT_LABEL",
    "ROOT_CAPS",
    "TASK_CAPABILITIES",
    "ContainerSpec",
    "GitProtection",
    "MirrorVolume",
    "capabilities_from_inspect",
    "engine_socket_exposed",
    "extra_tmpfs_options",
    "git_protection",
    "hardening_violations",
    "host_config_arguments",
    "host_tmpfs_dirs",
    "host_tmpfs_mount",
    "isolation_of",
    "mirror_mount_violations",
    "tmpfs_overlap",
    "tmpfs_sizes",
    "unconfined_mounts",
    "validate_labels",
    "validate_tmpfs",
]

GVISOR_RUNTIME = "runsc"

#: What the task profile adds to an empty capability set: what package managers (dpkg, apt dropping to
#: ``_apt``, pip) and ``adduser`` need -- a subset of Docker's default set. Never SYS_ADMIN, SYS_PTRACE,
#: SYS_MODULE, NET_ADMIN, NET_RAW or MKNOD; SYS_CHROOT, SETFCAP, SETPCAP and AUDIT_WRITE are left out too
#: (nothing a package install or a user change needs, and each is something a hostile root could use).
TASK_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
#: What a checkpointable container's root keeper needs to start the agent as the session's user.
KEEPER_CAPABILITIES = ("SETGID", "SETUID")

#: How a task container's root-filesystem writes are capped: by gVisor holding them in memory (within the
#: memory limit), by the engine's storage quota, or by the session stopping once its layer passes the cap.
ROOT_CAPS = ("memory", "quota", "watched")

MIB = 1024 * 1024


@dataclass(frozen=True)
class MirrorVolume:
    """A tmpfs volume holding a copy of the workspace at its path (mirror mode).

    The sandbox side of :class:`adk_sandbox.executor.workspace.mirror.MirrorWorkspace`.
    """

    size_mb: int
    uid: int
    gid: int
    """Owner of the volume's root directory: the command user."""
    mode: int
    """Permission bits of the volume's root directory (the host workspace root's)."""

    def mount(self, target: str) -> Mount:
        """An anonymous volume of the local driver: removed with its container (``v=True``, auto_remove)."""
        from docker.types import DriverConfig, Mount  # noqa: PLC0415

        options = f"size={self.size_mb}m,uid={self.uid},gid={self.gid},mode={self.mode:04o},nosuid,nodev"
        config = DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options})
        return Mount(target=target, source=None, type="volume", driver_config=config)


def mirror_mount_violations(inspect: dict[str, Any] | Any, workspace: str) -> list[str]:
    """What is wrong with the mirror volume of an inspected container (empty when it is as asked)."""
    mounts = [m for m in inspect.get("Mounts") or [] if m.get("Destination") == workspace]
    if len(mounts) != 1:
        return [f"the workspace copy is not mounted at {workspace}"]
    mount = mounts[0]
    problems = []
    if mount.get("Type") != "volume" or mount.get("Driver") != "local":
        problems.append(f"{workspace} is a {mount.get('Type')} mount, not the local tmpfs volume asked for")
    if not mount.get("RW"):
        problems.append(f"{workspace} is mounted read-only")
    return problems


@dataclass(frozen=True)
class ContainerSpec:
    """Everything that decides how a session container is created."""

    image: str
    limits: ResourceLimits
    runtime: str | None = None
    network: bool = False
    workspace: str | None = None
    """Host path bind-mounted read-write at the same path, and the commands' cwd."""
    workspace_source: str | None = None
    """The host directory bound at :attr:`workspace` when it is another (a fork with its processes binds
    a copy at its parent's path, docs/pause.md), and under which :attr:`read_only_mounts` below the
    workspace are; None: the same path."""
    extra_mounts: tuple[AllowedPath, ...] = ()
    """Further host paths (from a policy) mounted at the same path with their mode."""
    read_only_mounts: tuple[str, ...] = ()
    """Host paths mounted read-only over the workspace mount (the workspace's ``.git``)."""
    git_placeholder: str | None = None
    """An empty ``.git`` to create before start (the workspace has none), see :class:`GitProtection`."""
    extra_tmpfs: Mapping[str, int] = field(default_factory=dict)
    """Further writable tmpfs mounts asked for (path -> size in MiB), see :func:`validate_tmpfs`."""
    labels: Mapping[str, str] = field(default_factory=dict)
    lifetime_seconds: int = 12 * 3600
    mirror: MirrorVolume | None = None
    """Mount a copy of the workspace (a tmpfs volume) instead of binding the host directory."""
    profile: str = "hardened"
    """``"hardened"`` or ``"task"`` (docs/docker/profiles.md): the task profile's root is writable."""
    root_cap: str | None = None
    """How the task profile's root writes are capped (one of :data:`ROOT_CAPS`); None when hardened."""
    root_size_mb: int = 0
    """The cap on root writes, in MiB (the task profile)."""
    host_tmpfs: bool = False
    """``/tmp``, HOME and the extra tmpfs are tmpfs *volumes* (same size, ``nosuid,nodev``, mode 1777) whose
    host side this process reads and writes directly: a snapshot of them is a host copy, a fork's a host
    copy into them (``PoolConfig(forkable=True)``, docs/snapshots.md). False: plain tmpfs mounts."""
    state_owner: tuple[int, int] = (0, 0)
    """uid, gid owning the roots of those volumes (the command user: a host copy into them is its)."""
    extra_hosts: Mapping[str, str] = field(default_factory=dict)
    """Names written to the container's ``/etc/hosts`` (name -> loopback address), see
    :func:`validate_extra_hosts`: how sibling services resolve (docs/network.md, "Several services")."""
    layer_binds: tuple[tuple[str, str], ...] = ()
    """(host directory, path inside) bound with ``bind-propagation=rslave``: a layered pool member's state
    directories, whose fork's overlays the host mounts later (``PoolConfig(fork_by="layer")``, ``_layers``).
    They replace the workspace's bind and the tmpfs mounts at those paths."""
    direct_egress: str | None = None
    """The host directory of the session's direct egress socket (docs/network.md, "Speed"), bound
    read-only at :data:`~adk_sandbox.executor.channel.egress.DIRECT_MOUNT`; None: none (a remote engine,
    no network policy)."""
    checkpoints: bool = False
    """The container's command is the agent's keeper (docs/pause.md), so a checkpoint keeps the agent and
    everything it started: no init and no ``sleep``, stdin kept open for attaches, not removed when it
    stops (a checkpoint stops it), and CAP_SETUID and CAP_SETGID in its bounding set, with which the
    root keeper becomes the session's user (a command has them only when it runs as root)."""
    bound_agent: str | None = None
    """The host directory holding the agent binary alone (:func:`.static_agent.bound_agent_directory`),
    bound read-only at :data:`~adk_sandbox.executor._layout.AGENT_MOUNT`, from which a runc keeper runs:
    CRIU restores no executable from the loader's memfd. None: the loader's way (gVisor)."""

    @property
    def task(self) -> bool:
        """True for the task profile."""
        return self.profile == "task"

    def host_path(self, path: str) -> str:
        """The host side of a mount at ``path`` inside (below the workspace: under the workspace_source)."""
        if self.workspace_source and self.workspace and path.startswith(self.workspace.rstrip("/") + "/"):
            return self.workspace_source + path[len(self.workspace.rstrip("/")) :]
        return path

    @property
    def workdir(self) -> str:
        """Where commands start: the workspace, else the scratch tmpfs.

        A task container without a workspace starts at its image's ``WORKDIR`` instead: the opened container
        says.
        """
        return self.workspace or "/tmp"


@dataclass(frozen=True)
class GitProtection:
    """How the workspace's ``.git`` is kept out of the sandbox's reach (see docs/DOCKER.md, ``.git``)."""

    read_only_mounts: tuple[str, ...] = ()
    """Paths mounted read-only at the same place: ``.git`` itself (a directory or a ``gitdir:`` file)."""
    placeholder: str | None = None
    """A ``.git`` directory to create (empty) before the container starts and remove after, when the
    workspace has none: mounted read-only, it keeps the sandbox from planting a repository there."""


def git_protection(workspace: str) -> GitProtection:
    """Protect the workspace's ``.git`` as a whole: its directory (or ``gitdir:`` file) goes read-only.

    Host git run in the workspace honours what ``.git`` holds (hooks, ``core.fsmonitor``, ``commondir``,
    ``gitdir`` indirections), so nothing in it may be written from the container. A mount point cannot be
    renamed or removed (EBUSY), so ``mv .git elsewhere`` and rebuilding one fails too. Without a ``.git``,
    an empty read-only placeholder is mounted so the sandbox cannot create one. A symlinked ``.git`` is
    refused: the link itself would stay replaceable.
    """
    path = os.path.join(workspace, ".git")
    if os.path.islink(path):
        raise PolicyNotEnforceableError(
            f"{path} is a symbolic link; the sandbox could replace it with a repository of its own that "
            "host git would then run hooks from. Replace the link with the directory (or a `gitdir:` file)"
        )
    if os.path.isdir(path) or os.path.isfile(path):
        return GitProtection(read_only_mounts=(path,))
    if os.path.lexists(path):
        raise PolicyNotEnforceableError(f"{path} is neither a directory nor a file; remove it first")
    return GitProtection(read_only_mounts=(path,), placeholder=path)


#: Where container engines put their API sockets (``/var/run`` is resolved to ``/run`` by realpath).
ENGINE_SOCKETS = (
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/crio/crio.sock",
    "/run/dockershim.sock",
    "/run/buildkit/buildkitd.sock",
    "/run/docker/containerd/containerd.sock",
)


def _is_within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def engine_socket_exposed(source: str, extra_sockets: Iterable[str] = ()) -> bool:
    """True when mounting ``source`` would let the container reach a container engine's API socket.

    A socket is reachable through a read-only mount too (``connect`` needs no write access), so any mount
    that is, or contains, an engine socket is one request away from root on the host: the socket itself,
    any ``*.sock`` file, or a directory above a known engine socket (``/``, ``/run``, ``/var``...). Reads
    the filesystem (realpath, stat): not pure, but the answer depends on the host, not the container.
    """
    real = os.path.realpath(source)
    try:
        if stat.S_ISSOCK(os.stat(real).st_mode) or real.endswith(".sock"):
            return True
    except OSError:
        pass
    uid = os.getuid()
    known = [*ENGINE_SOCKETS, f"/run/user/{uid}/docker.sock", f"/run/user/{uid}/podman/podman.sock"]
    return any(_is_within(os.path.realpath(sock), real) for sock in (*known, *extra_sockets))


def tmpfs_options(limits: ResourceLimits) -> str:
    """Options of the writable tmpfs mounts: executable (build tools run from /tmp), bounded in size."""
    return f"rw,exec,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"


#: The tmpfs mounts every session container has: an extra one may not sit on, above or below them.
BUILTIN_TMPFS = ("/tmp", HOME_DIR)
#: Kernel filesystems the runtime mounts: a tmpfs over (or in) them would hide what the runtime masks.
#: What the runtime mounts and masks itself: no workspace or tmpfs may sit in or over them.
MAX_EXTRA_TMPFS = 16
MAX_TMPFS_MB = 64 * 1024

_TmpfsSizes = TypeAdapter(dict[str, Annotated[int, Field(strict=True, ge=1, le=MAX_TMPFS_MB)]])


def _overlaps(a: str, b: str) -> bool:
    return _is_within(a, b) or _is_within(b, a)


def validate_tmpfs(tmpfs: Mapping[str, int]) -> dict[str, int]:
    """Check the extra tmpfs mounts asked of a :class:`DockerBackend`; :class:`InvalidRequestError` if not.

    Each path is absolute and normalised (``os.path.normpath`` leaves it as it is), not ``/``, and
    neither on, above nor below ``/proc``, ``/sys``, ``/dev``, ``/tmp``, HOME or another extra mount;
    each size is 1 to 65536 MiB (tmpfs pages count against the container's memory limit). The
    workspace and policy paths are checked when a session is made (:func:`tmpfs_overlap`).
    """
    try:
        sizes = _TmpfsSizes.validate_python(dict(tmpfs))
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InvalidRequestError(
            f"tmpfs must map absolute paths to sizes in MiB (1 to {MAX_TMPFS_MB}): {problems}"
        ) from exc
    if len(sizes) > MAX_EXTRA_TMPFS:
        raise InvalidRequestError(f"at most {MAX_EXTRA_TMPFS} extra tmpfs mounts, not {len(sizes)}")
    for path in sizes:
        if not path.startswith("/") or posixpath.normpath(path) != path or "//" in path or "\0" in path:
            raise InvalidRequestError(
                f"tmpfs path {path!r} must be absolute and normalised (no '..', '.', '//' or trailing '/')"
            )
        if path == "/":
            raise InvalidRequestError("tmpfs path '/' would hide the whole image; name a directory")
        for reserved in (*KERNEL_PATHS, *BUILTIN_TMPFS):
            if _overlaps(path, reserved):
                raise InvalidRequestError(
                    f"tmpfs path {path!r} overlaps {reserved}, which the sandbox mounts itself; "
                    "name a directory outside /proc, /sys, /dev, /tmp and HOME (e.g. /var/tmp)"
                )
        for other in sizes:
            if other != path and _is_within(path, other):
                raise InvalidRequestError(f"tmpfs path {path!r} lies inside the tmpfs path {other!r}")
    return sizes


MAX_USER_LABELS = 64
_LabelKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,254}$")]
_Labels = TypeAdapter(dict[_LabelKey, Annotated[str, Field(strict=True, max_length=4096)]])


def validate_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Check user labels for a :class:`DockerBackend`'s containers; :class:`InvalidRequestError` if not.

    Keys are 1-255 characters of letters, digits and ``. _ / : -`` starting with a letter or digit
    (Docker's reverse-DNS style, e.g. ``org.example.eval``); values are strings of at most 4096
    characters; at most 64 labels. Keys in this project's namespace (``io.adk-sandbox.``, any case) are
    refused: the reaper trusts those labels to decide which containers it may remove.
    """
    try:
        checked = _Labels.validate_python(dict(labels))
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise InvalidRequestError(
            "labels must map keys of letters, digits and '._/:-' (e.g. 'org.example.eval') to strings "
            f"of at most 4096 characters: {problems}"
        ) from exc
    if len(checked) > MAX_USER_LABELS:
        raise InvalidRequestError(f"at most {MAX_USER_LABELS} labels, not {len(checked)}")
    for key in checked:
        if key.lower().startswith(LABEL_PREFIX):
            raise InvalidRequestError(
                f"label {key!r} is in this project's namespace ({LABEL_PREFIX}*), which marks who owns a "
                "container and when it may be removed; use a key of your own (e.g. 'org.example.run')"
            )
    return checked


_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)*$"
)
#: The most names a container's ``/etc/hosts`` gets this way.
MAX_EXTRA_HOSTS = 256


def validate_extra_hosts(hosts: Mapping[str, str]) -> dict[str, str]:
    """Check ``/etc/hosts`` entries (name -> address); :class:`InvalidRequestError` if not.

    Names are host names (letters, digits, ``-``, ``_``, dots between labels); addresses dotted IPv4
    addresses in ``127.0.0.0/8`` only: such a name leads to something this sandbox itself listens on
    (the listener of a sibling service, see :mod:`adk_sandbox.executor.channel.services`), never to a
    route out. At most :data:`MAX_EXTRA_HOSTS`.
    """
    if not isinstance(hosts, Mapping):
        raise InvalidRequestError(f"extra_hosts must map names to addresses, not {hosts!r}")
    if len(hosts) > MAX_EXTRA_HOSTS:
        raise InvalidRequestError(f"at most {MAX_EXTRA_HOSTS} extra hosts, not {len(hosts)}")
    checked: dict[str, str] = {}
    for name, address in hosts.items():
        if not (isinstance(name, str) and _HOST_NAME.match(name)):
            raise InvalidRequestError(f"extra_hosts: {name!r} is not a host name")
        try:
            parsed = ipaddress.IPv4Address(address)
        except (ValueError, TypeError):
            parsed = None
        if parsed is None or not parsed.is_loopback or str(parsed) != address:
            raise InvalidRequestError(
                f"extra_hosts: {name} -> {address!r}: only IPv4 addresses in 127.0.0.0/8 are accepted (the "
                "name leads to a listener of this sandbox, never out)"
            )
        checked[name] = address
    return checked


def tmpfs_overlap(tmpfs: Iterable[str], mounts: Iterable[str]) -> str | None:
    """Why an extra tmpfs cannot go with these host mounts (workspace, ``.git``, policy paths), or None.

    A tmpfs on or above a bind mount would hide it (commands would write into memory, not the
    workspace); one below would hide part of it.
    """
    for path in tmpfs:
        for mount in mounts:
            if _overlaps(path, mount):
                return (
                    f"tmpfs path {path!r} overlaps the host mount {mount!r}: it would hide the host "
                    "files there; name a directory outside the workspace and the policy's paths"
                )
    return None


def extra_tmpfs_options(size_mb: int) -> str:
    """Options of an extra tmpfs: like ``/tmp``, never set-id or device files, bounded in size.

    Executable on purpose: inspect_ai copies its tool helpers into ``/var/tmp`` and runs them there.
    """
    return f"rw,exec,nosuid,nodev,size={size_mb}m,mode=1777"


def tmpfs_sizes(spec: ContainerSpec) -> dict[str, int]:
    """Every writable tmpfs of a container (``/tmp``, HOME, the extra ones): path -> MiB."""
    return {"/tmp": spec.limits.tmpfs_mb, HOME_DIR: spec.limits.tmpfs_mb, **spec.extra_tmpfs}


def host_tmpfs_mount(target: str, size_mb: int, owner: tuple[int, int]) -> Mount:
    """A tmpfs volume at ``target`` with a tmpfs mount's protections: ``size=``, ``nosuid,nodev``, 1777.

    Anonymous, so removed with its container; its host side (the volume's mount point) is a tmpfs the
    engine mounted, which this process reads and writes for snapshots and forks (:func:`host_tmpfs_dirs`).
    """
    from docker.types import DriverConfig, Mount  # noqa: PLC0415

    uid, gid = owner
    options = f"size={size_mb}m,uid={uid},gid={gid},mode=1777,nosuid,nodev"
    config = DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options})
    return Mount(target=target, source=None, type="volume", driver_config=config)


def host_tmpfs_dirs(
    inspect: Mapping[str, Any], sizes: Mapping[str, int], mounts: list[MountEntry]
) -> tuple[dict[str, str], list[str]]:
    """The host directories of a container's tmpfs volumes (path inside -> host path), and what is wrong.

    ``mounts`` are this process's (``/proc/self/mountinfo``): each volume's host side must be a tmpfs this
    process sees, mounted ``nosuid,nodev`` with the size asked, else the host could not copy it, or a copy
    into it would not land in the container, or a protection of the tmpfs would be lost.
    """
    mounted = top_mounts(mounts)
    found: dict[str, str] = {}
    problems: list[str] = []
    for mount in inspect.get("Mounts") or []:
        if mount.get("Type") == "volume" and mount.get("Destination") in sizes:
            found[str(mount["Destination"])] = str(mount.get("Source") or "")
    for path, size in sizes.items():
        source = found.get(path)
        if source is None:
            problems.append(f"{path} is not a tmpfs volume")
            continue
        top = mounted.get(source)
        if top is None or top.fstype != "tmpfs":
            problems.append(f"the host side of {path} ({source}) is not a tmpfs this process sees")
        elif not {"nosuid", "nodev"} <= top.options or f"size={size * 1024}k" not in top.super_options:
            problems.append(f"the host side of {path} ({source}) is not mounted nosuid,nodev,size={size}m")
    return found, problems


def host_config_arguments(spec: ContainerSpec) -> dict[str, Any]:
    """Keyword arguments for docker-py's ``create_host_config``: the hardened defaults (docs/docker/)."""
    from docker.types import LogConfig, Mount, Ulimit  # noqa: PLC0415

    mounts = []
    if spec.host_tmpfs:
        mounts += [host_tmpfs_mount(path, mb, spec.state_owner) for path, mb in tmpfs_sizes(spec).items()]
    layered = {target for _, target in spec.layer_binds}
    mounts += [
        Mount(target=target, source=source, type="bind", read_only=False, propagation="rslave")
        for source, target in spec.layer_binds
    ]
    if spec.workspace and spec.mirror is not None:
        mounts.append(spec.mirror.mount(spec.workspace))
    elif spec.workspace and spec.workspace not in layered:
        source = spec.workspace_source or spec.workspace
        mounts.append(Mount(target=spec.workspace, source=source, type="bind", read_only=False))
    for allowed in spec.extra_mounts:
        read_only = allowed.mode == "read_only"
        mounts.append(Mount(target=allowed.path, source=allowed.path, type="bind", read_only=read_only))
    for path in spec.read_only_mounts:
        mounts.append(Mount(target=path, source=spec.host_path(path), type="bind", read_only=True))
    if spec.direct_egress is not None:
        mounts.append(Mount(target=DIRECT_MOUNT, source=spec.direct_egress, type="bind", read_only=True))
    if spec.bound_agent is not None:
        mounts.append(Mount(target=AGENT_MOUNT, source=spec.bound_agent, type="bind", read_only=True))
    limits = spec.limits
    memory = limits.memory_mb * MIB
    task: dict[str, Any] = {}
    if spec.task:
        task["cap_add"] = list(TASK_CAPABILITIES)
        if spec.root_cap == "quota":
            task["storage_opt"] = {"size": f"{spec.root_size_mb}M"}
    if spec.checkpoints:
        task["cap_add"] = sorted({*task.get("cap_add", ()), *KEEPER_CAPABILITIES})
    return {
        "network_mode": "bridge" if spec.network else "none",
        "cap_drop": ["ALL"],
        # The sandbox seccomp profile: Docker's default minus set-id modes, or the task profile's (_seccomp).
        "security_opt": ["no-new-privileges", profile_option(task=spec.task, keeper=_gvisor_keeper(spec))],
        # Its own cgroup namespace (the default is the host's on cgroup v1): no view of the host's tree.
        "cgroupns": "private",
        "read_only": not spec.task,
        **task,
        "tmpfs": {}
        if spec.host_tmpfs or spec.layer_binds
        else {
            "/tmp": tmpfs_options(limits),
            HOME_DIR: tmpfs_options(limits),
            **{path: extra_tmpfs_options(size) for path, size in spec.extra_tmpfs.items()},
        },
        # The keeper is its own init (it reaps orphans); otherwise Docker's, for sleep cannot reap.
        "init": not spec.checkpoints,
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
        # A leaked container removes itself once its keeper process ends (see the session's lifetime);
        # one that is checkpointed stops and must stay (the reaper removes it once its owner is gone).
        "auto_remove": not spec.checkpoints,
        **({"extra_hosts": dict(spec.extra_hosts)} if spec.extra_hosts else {}),
    }


def _gvisor_keeper(spec: ContainerSpec) -> bool:
    """Whether the container gets the keeper's seccomp profile (``clone3`` let through): gVisor's only.

    runsc answers a refused ``clone3`` with EPERM, not the profile's ENOSYS, which leaves glibc without
    threads there; on runc the kernel answers ENOSYS, and a ``clone3`` let through could make a user
    namespace, whose flags seccomp cannot read in ``clone3``'s argument structure.
    """
    return spec.checkpoints and spec.runtime == GVISOR_RUNTIME


def isolation_of(inspect: Mapping[str, Any]) -> IsolationClass:
    """The class of a running container: gVisor when its runtime is runsc, else a plain container."""
    runtime = inspect.get("HostConfig", {}).get("Runtime") or ""
    return IsolationClass.GVISOR if runtime == GVISOR_RUNTIME else IsolationClass.CONTAINER


def hardening_violations(  # noqa: PLR0912, PLR0915 - one check per line reads best as one function
    inspect: Mapping[str, Any],
    *,
    network: bool = False,
    runtime: str | None = None,
    limits: ResourceLimits | None = None,
    mounts: Sequence[str] = (),
    attached: bool = False,
    engine_sockets: Iterable[str] = (),
    tmpfs: Mapping[str, str] | None = None,
    task: bool = False,
    keeper: bool = False,
) -> list[str]:
    """What the inspected container lacks of the hardening asked for (empty when all is in force).

    ``keeper``: a checkpointable container, whose keeper may have :data:`KEEPER_CAPABILITIES` too (and
    under gVisor the keeper's seccomp profile).

    ``task``: the task profile's shape is what is asked (docs/docker/profiles.md): a writable root, the
    capabilities of :data:`TASK_CAPABILITIES` at most, and the task seccomp profile.

    ``limits`` None means "any limit, but some limit" (attach mode: the compose file chose the values).
    ``mounts`` are the host paths expected as bind-mount sources. Any other host mount is a violation,
    except when ``attached``: a container someone else made may mount more (it is then reported as not
    confining the host filesystem, see :func:`capabilities_from_inspect`) — but never a container engine's
    socket (``engine_sockets`` adds the socket of the daemon in use), which is root on the host.
    ``tmpfs`` (path -> options, as :func:`host_config_arguments` asked) must all be mounted so.
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
    added = {cap.upper().removeprefix("CAP_") for cap in host.get("CapAdd") or []}
    allowed_caps = set(TASK_CAPABILITIES if task else ()) | set(KEEPER_CAPABILITIES if keeper else ())
    want(added <= allowed_caps, f"capabilities are added: {sorted(added - allowed_caps)}")
    raw_options = list(host.get("SecurityOpt") or [])
    options = [option.replace(":", "=", 1) for option in raw_options if not option.startswith("seccomp")]
    want(
        any(option in ("no-new-privileges", "no-new-privileges=true") for option in options),
        "no-new-privileges is not set",
    )
    seccomp = seccomp_profile_of(raw_options)
    if seccomp == "unconfined":
        problems.append("the seccomp profile is disabled")
    elif seccomp is None:
        problems.append(
            "the seccomp profile is Docker's default, which lets commands create setuid files on the host; "
            "use the sandbox profile (security_opt seccomp=executor/backends/docker/seccomp/adk-sandbox.json)"
        )
    elif seccomp != load_profile(task=task, keeper=keeper and runtime == GVISOR_RUNTIME):
        problems.append("the seccomp profile is not the sandbox's (a custom profile cannot be verified)")
    want("apparmor=unconfined" not in options, "the AppArmor profile is disabled")
    want("label=disable" not in options, "SELinux labelling is disabled")
    want(
        bool(host.get("MaskedPaths")) and bool(host.get("ReadonlyPaths")),
        "/proc and /sys paths are not masked (systempaths=unconfined)",
    )
    want(host.get("CgroupnsMode") != "host", "CgroupnsMode shares the host's cgroup namespace")
    want(not host.get("OomKillDisable"), "the OOM killer is disabled")
    if not task:
        want(bool(host.get("ReadonlyRootfs")), "the root filesystem is writable")
    for namespace in ("PidMode", "IpcMode", "UTSMode", "UsernsMode"):
        mode = str(host.get(namespace) or "")
        want(mode != "host", f"{namespace} shares the host's namespace")
        want(not mode.startswith("container:"), f"{namespace} shares another container's namespace")
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
    problems += _tmpfs_violations(host.get("Tmpfs") or {}, tmpfs or {})
    allowed = set(mounts)
    sockets = tuple(engine_sockets)
    for mount in inspect.get("Mounts") or []:
        if mount.get("Type") != "bind":
            continue
        source, destination = str(mount.get("Source") or ""), str(mount.get("Destination") or "")
        if engine_socket_exposed(source, sockets) or destination.endswith(".sock"):
            problems.append(
                f"a container engine's socket is reachable through the mount {source} -> {destination}"
            )
        elif source not in allowed and not attached:
            problems.append(f"unexpected host mount {source} -> {destination}")
    return problems


def _tmpfs_violations(mounted: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    problems = []
    for path, options in wanted.items():
        if path not in mounted:
            problems.append(f"the tmpfs {path} is not mounted")
        elif mounted[path] != options:
            problems.append(f"the tmpfs {path} is mounted {mounted[path]!r}, not {options!r}")
    return problems


def unconfined_mounts(inspect: Mapping[str, Any], confined: Sequence[str]) -> list[tuple[str, bool]]:
    """Host bind mounts beyond ``confined`` (workspace, ``.git``, policy paths): (source, writable)."""
    allowed = set(confined)
    return [
        (str(mount.get("Source")), bool(mount.get("RW")))
        for mount in inspect.get("Mounts") or []
        if mount.get("Type") == "bind" and mount.get("Source") not in allowed
    ]


def capabilities_from_inspect(
    inspect: Mapping[str, Any],
    languages: tuple[Language, ...],
    confined: Sequence[str] = (),
    *,
    channel: str | None = None,
    root_cap: str | None = None,
) -> Capabilities:
    """What a running container enforces, read from its inspected configuration.

    ``confined`` are the bind-mount sources the caller asked for; any other host path mounted (an attached
    container's extra volumes) means host reads are not confined, and writes too when it is writable.
    ``channel`` is how commands reach the container (``"agent"``). ``root_cap`` is how a
    writable root's writes are capped (:data:`ROOT_CAPS`): a writable root counts as confined only with one.
    """
    host = inspect.get("HostConfig") or {}
    extra = unconfined_mounts(inspect, confined)
    read_only = bool(host.get("ReadonlyRootfs"))
    return Capabilities(
        isolation=isolation_of(inspect),
        timeout=True,
        memory=(host.get("Memory") or 0) > 0,
        cpu=(host.get("NanoCpus") or 0) > 0 or (host.get("CpuQuota") or 0) > 0,
        pids=(host.get("PidsLimit") or 0) > 0,
        network=host.get("NetworkMode") == "none",
        # The container sees its image, the checked mounts and nothing else, unless ``extra`` says more.
        fs_read=not extra,
        # A task container's root writes go to a per-session, capped layer that no host program reads.
        fs_write=(read_only or root_cap in ROOT_CAPS) and not any(writable for _, writable in extra),
        env=True,
        languages=languages,
        channel=channel,
        profile="hardened" if read_only else "task",
        root_cap=None if read_only else root_cap,
    )
