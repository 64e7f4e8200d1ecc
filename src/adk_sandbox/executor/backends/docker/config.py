"""DockerConfig: every setting of a :class:`~.docker.DockerBackend`, checked in one model.

``DockerBackend(config=DockerConfig(...))`` and ``DockerBackend(...)`` with the same keyword options are
the same backend: the keywords build this model. Its checks raise what the backend's constructor always
raised -- :class:`~adk_sandbox.executor.errors.InvalidRequestError` (a ``ValueError``, so built directly the
model reports it inside pydantic's ``ValidationError``) and
:class:`~adk_sandbox.executor.errors.PolicyNotEnforceableError` for a policy a container cannot enforce --
with the same messages.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from adk_sandbox.executor._layout import KERNEL_PATHS
from adk_sandbox.executor.backends.docker._spec import (
    BUILTIN_TMPFS,
    MAX_TMPFS_MB,
    tmpfs_overlap,
    validate_extra_hosts,
    validate_labels,
    validate_tmpfs,
)
from adk_sandbox.executor.backends.docker.engine import Engine
from adk_sandbox.executor.errors import (
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    validation_problems,
)
from adk_sandbox.executor.network.policy import NetworkPolicy, network_setting
from adk_sandbox.executor.policy import SandboxPolicy
from adk_sandbox.executor.pool import PoolSettings
from adk_sandbox.executor.types import ResourceLimits, check_user
from adk_sandbox.executor.workspace.mirror import DEFAULT_MIRROR_MB
from adk_sandbox.executor.workspace.protocol import WORKSPACE_TRANSPORTS

__all__ = [
    "BASE_IMAGE",
    "DEFAULT_LIFETIME_SECONDS",
    "DEFAULT_ROOT_MB",
    "EXEC_TRANSPORT_REMOVED",
    "PROFILES",
    "RUST_IMAGE",
    "DockerConfig",
    "ExpectedImage",
    "PoolConfig",
    "config_from_options",
]

# Here, not in images.py and pool.py (which import them from here): this module loads without docker-py.
BASE_IMAGE = "adk-sandbox/base:latest"
RUST_IMAGE = "adk-sandbox/rust:latest"
#: Why ``transport="exec"`` is refused: the exec transport was removed (docs/docker/agent-channel.md).
EXEC_TRANSPORT_REMOVED = (
    "transport='exec' was removed: commands reach a Docker container only through its in-sandbox agent "
    "(transport='agent', the default), which needs /bin/sh, chmod and an executable /tmp (or $HOME) in "
    "the image, and no python3; drop the transport argument"
)


@dataclass(frozen=True)
class ExpectedImage:
    """The image id a session's container must run, and how a different one is treated."""

    image_id: str
    pinned: bool
    """True: given by the caller (``DockerBackend(image_id=...)``), a mismatch is refused. False: read from
    this machine's engine for a remote one, a mismatch is warned about (:class:`ImageMismatchWarning`)."""


#: The validation context key under which the backend's fork spares name the copies directory, below which
#: (``/dev/shm``) their path may lie: ``PoolConfig.model_validate(..., context={COPIES_CONTEXT: dir})``.
COPIES_CONTEXT = "adk-sandbox-copies-dir"


class PoolConfig(PoolSettings):
    """How a :class:`SessionPool` keeps its members (``DockerBackend(pool=PoolConfig(size=4, ...))``).

    ``size`` (1 to 256 started containers), ``acquire_timeout_seconds`` (120) and ``ping_timeout_seconds``
    (2) are every pool's (:class:`~adk_sandbox.executor.pool.PoolSettings`).
    """

    max_age_seconds: Annotated[float, Field(gt=0)] = 600.0
    """A member older than this is replaced, not handed out (bounds how stale a ready container gets;
    it must be below the backend's ``lifetime_seconds``, which runs from the member's create)."""
    create_concurrency: Annotated[int, Field(ge=1, le=32)] = 2
    """At most this many containers being created and started at once (refills)."""
    remove_concurrency: Annotated[int, Field(ge=1, le=32)] = 2
    """At most this many containers being removed at once (released and replaced members)."""
    workspace: Literal["none", "mirror"] = "none"
    """What the members serve. ``"none"``: workspace-less ``backend.session()``. ``"mirror"``: copies,
    ``backend.session(copy_of=X)``; each member then holds an empty mirror volume at a directory the pool
    made, which ``X`` is copied into at acquire (``backend.session()`` then starts cold)."""
    path: str | None = None
    """With ``workspace="mirror"``: where each member's workspace is inside its sandbox, the same for all
    (its host directory is still its own). None: at its host directory's path. A pool with a path also
    serves ``backend.session(snapshot=s)`` for snapshots whose workspace is at that path (forks of its own
    sessions; docs/snapshots.md)."""

    forkable: bool = False
    """With ``path``: each member's ``/tmp``, HOME and extra tmpfs are tmpfs volumes (the same size and
    ``nosuid,nodev``) that this process copies on the host, so a snapshot of a member and a fork into one
    copy them on the host instead of archiving them through the sandbox (docs/snapshots.md). Needs a local
    engine whose volumes this process reaches (root); refused at the first member's start otherwise."""

    fork_by: Literal["copy", "layer"] = "copy"
    """With ``forkable``: how a fork gets the snapshot's files. ``"copy"``: copied on the host into the
    member's directory and volumes. ``"layer"``: each member's state directories are host mount points
    propagated into its container, and a fork mounts an overlay per directory over the snapshot's copy
    (nothing copied, nothing scanned; docs/snapshots.md, "Forks by layer"). Such a member serves
    ``session(snapshot=s)`` and ``session(copy_of=X)`` (X copied into its fresh tmpfs, a bound workspace);
    needs root on a local engine, overlayfs and runc (refused when the pool starts otherwise)."""

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is None:
            return None
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            raise ValueError("must be an absolute, normalised directory path other than /")
        copies = (info.context or {}).get(COPIES_CONTEXT)
        if isinstance(copies, str) and path.startswith(copies.rstrip("/") + "/"):
            # The backend's own spares for a copy's forks: a copy is mounted there already (copy_of), so a
            # member may be too. Never a user's setting: only this context allows it.
            return path
        for reserved in (*KERNEL_PATHS, *BUILTIN_TMPFS):
            if path == reserved or path.startswith(reserved + "/") or reserved.startswith(path + "/"):
                raise ValueError(f"overlaps {reserved}, which the sandbox mounts itself")
        return path

    @model_validator(mode="after")
    def _path_needs_mirror(self) -> PoolConfig:
        if self.path is not None and self.workspace != "mirror":
            raise ValueError("path= is where a member's workspace copy is: it needs workspace='mirror'")
        if self.forkable and self.path is None:
            raise ValueError("forkable=True serves forks, which a pool serves only at a path: give path=")
        if self.fork_by == "layer" and not self.forkable:
            raise ValueError("fork_by='layer' is how a forkable pool serves forks: give forkable=True")
        return self


#: How long a container this library creates may live at most (its expiry label; the reaper enforces it).
DEFAULT_LIFETIME_SECONDS = 12 * 3600
#: The profiles a container can be made in (docs/docker/profiles.md).
PROFILES = ("hardened", "task")
#: The task profile's cap on what a session writes to its root filesystem, unless ``root_size_mb`` says.
DEFAULT_ROOT_MB = 4096
_IMAGE_ID = re.compile(r"(sha256:)?[0-9a-f]{64}")


class DockerConfig(BaseModel):
    """How a :class:`~.docker.DockerBackend` makes (or attaches to) its containers.

    >>> config = DockerConfig(runtime="runsc", limits=ResourceLimits(memory_mb=512), pool=2)
    >>> config.pool.size
    2

    Every field is what the backend's keyword option of the same name takes (docs/DOCKER.md,
    "Configuration"); ``DockerBackend(config=config)`` uses it as it is, ``backend.config`` gives it back.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    type: Literal["docker"] = "docker"
    """Discriminator, for configs that choose a backend by type (gVisor is ``runtime="runsc"``)."""
    image: str = BASE_IMAGE
    """The image of the containers this backend creates (built locally or pushed; never pulled)."""
    profile: Literal["hardened", "task"] = "hardened"
    """The shape of the containers (docs/docker/profiles.md). ``"hardened"``: read-only root filesystem, no
    capabilities, commands as the workspace owner, set-id modes refused -- for an agent editing a user's
    checkout. ``"task"``: an evaluation's image as it is -- commands as the image's ``USER`` (usually
    root), a writable root filesystem capped at ``root_size_mb`` and discarded at close, the few
    capabilities package managers need; the workspace travels only as a copy (``mirror``)."""
    root_size_mb: int | None = None
    """The task profile's cap on root-filesystem writes, in MiB (default 4096); refused with ``"hardened"``,
    whose root is read-only. Enforced by gVisor's memory-backed overlay (within the memory limit), an
    engine storage quota, or by stopping the session once its writable layer passes it."""
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    """Memory (= memory+swap), cpu, pids, tmpfs size, file size and open files of each container."""
    runtime: str | None = None
    """The OCI runtime (``"runsc"`` for gVisor); None: the engine's default (``runc``)."""
    network: bool | NetworkPolicy = False
    """``False``: network ``none``. ``True``: Docker's default bridge (as does a policy that allows network:
    :attr:`DockerBackend.network` is the two together). A :class:`~adk_sandbox.executor.network.NetworkPolicy`
    (or a mapping of its fields, ``{"allow": [...], "hosts": {...}}``): the container keeps network ``none``
    and its agent serves an HTTP proxy on ``127.0.0.1`` whose connections the host decides by the policy
    (docs/network.md); needs the agent channel. ``session.set_network`` changes it at run time."""
    user: str | None = None
    """Who commands run as, instead of the owner of the workspace root (hardened) or the image's ``USER``
    (task): ``"uid:gid"``, a uid, or names from the container's ``/etc/passwd`` (``"root"``,
    ``"app:app"``)."""
    container: str | None = None
    """Attach to this existing container (e.g. a compose service) instead of creating them: its hardening
    is verified the same way and it is never removed by this library."""
    policy: SandboxPolicy = Field(default_factory=SandboxPolicy)
    """Bind mounts (its ``allowed_paths``, at the same path), environment and network permission. A
    container cannot forbid spawning processes, so the policy must say ``allow_process_spawn``."""
    lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS
    """How long a container may live: its expiry label, after which any backend's reaper removes it."""
    transport: str = "agent"
    """How commands reach a session's container: ``"agent"``, the only value (one long-lived in-sandbox
    agent per user of a session, docs/docker/agent-channel.md); kept so configs that name it still load.
    ``"exec"`` (an exec per command) was removed and is refused with :data:`EXEC_TRANSPORT_REMOVED`."""
    tmpfs: dict[str, int] = Field(default_factory=dict)
    """Extra writable tmpfs mounts, absolute path -> MiB (e.g. ``{"/var/tmp": 64}``), mounted
    ``exec,nosuid,nodev`` like ``/tmp`` (docs/DOCKER.md, "Extra tmpfs mounts"); not with ``container``."""
    extra_hosts: dict[str, str] = Field(default_factory=dict)
    """Names added to each container's ``/etc/hosts``, name -> an IPv4 address in ``127.0.0.0/8`` (how
    sibling services of one sample resolve each other, docs/network.md "Several services"); not with
    ``container``."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every container this backend creates (keys in this project's ``io.adk-sandbox.``
    namespace are refused: the reaper relies on them); not with ``container``."""
    engine: Engine | str | None = None
    """The Docker engine: an :class:`~adk_sandbox.executor.backends.docker.engine.Engine`, a URL (``unix://``,
    ``tcp://`` with TLS from ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``, ``ssh://``) or a Docker context's
    name; None: the one the Docker CLI would use. Resolved when the backend connects
    (:attr:`DockerBackend.engine`)."""
    workspace_transport: str = "auto"
    """How a session's workspace reaches the container (docs/DOCKER.md, "Workspace transport"):
    ``"bind"`` mounts the host directory, ``"mirror"`` copies it into a tmpfs volume and syncs it before
    and after each command, ``"auto"`` binds when the engine sees the directory, else mirrors."""
    mirror_size_mb: int = DEFAULT_MIRROR_MB
    """Size cap of a mirrored workspace's volume, in MiB (1 to 65536)."""
    image_id: str | None = None
    """Pin the image (``sha256:<64 hex>``): a container running another one is refused before anything
    runs in it. None: on a remote engine, the id the image has on this machine's engine is expected and a
    mismatch only warns (docs/DOCKER.md, "Images on a remote engine")."""
    pool: PoolConfig | None = None
    """Keep started containers for workspace-less sessions, each used once (docs/DOCKER.md, "Warm
    pool"); an int ``N`` means ``PoolConfig(size=N)``. ``PoolConfig(workspace="mirror")`` keeps them for
    ``backend.session(copy_of=...)`` instead: each with an empty workspace copy, filled at acquire."""
    fork_spares: Annotated[int, Field(ge=0, le=8)] = 1
    """Started containers kept per forked workspace path, so forks of any session come warm, by layer
    (docs/snapshots.md, "Forks of any session"): made when a session is first snapshotted, where the engine
    allows (root on a local engine, runc, a workspace outside the sandbox's own directories). 0: none."""
    checkpoints: bool = False
    """Make each session's container so that ``session.pause()`` can move it to a checkpoint on disk and
    bring back every process (docs/pause.md): the agent's keeper is the container's command. On gVisor
    (``runtime="runsc"``) or runc (CRIU where the engine runs, a local engine), with the engine's
    experimental checkpoints; not with ``container``, ``pool`` or ``workspace_transport="mirror"``.
    Refused where it cannot be given."""
    idle_pause_seconds: Annotated[float, Field(gt=0)] | None = None
    """Pause a session to disk once it sat idle this long: no call of it reached inside, and its processes
    used next to no CPU (docs/pause.md, "Idle pause"); the next call resumes it. Needs ``checkpoints``
    and a local engine. None: never."""

    @field_validator("network", mode="before")
    @classmethod
    def _network_kind(cls, network: object) -> object:
        return network_setting(network)

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, transport: str) -> str:
        if transport == "exec":
            raise InvalidRequestError(EXEC_TRANSPORT_REMOVED)
        if transport != "agent":
            raise InvalidRequestError(f"transport must be 'agent' (the default), not {transport!r}")
        return transport

    @field_validator("policy")
    @classmethod
    def _policy_allows_spawning(cls, policy: SandboxPolicy) -> SandboxPolicy:
        if not policy.allow_process_spawn:
            raise PolicyNotEnforceableError(
                "a container cannot forbid spawning processes; use a policy built with "
                ".allow_process_spawn() (the pids limit bounds how many may run)"
            )
        return policy

    @field_validator("lifetime_seconds")
    @classmethod
    def _positive_lifetime(cls, seconds: int) -> int:
        if seconds <= 0:
            raise InvalidRequestError("lifetime_seconds must be positive")
        return seconds

    @field_validator("workspace_transport")
    @classmethod
    def _known_workspace_transport(cls, mode: str) -> str:
        if mode not in WORKSPACE_TRANSPORTS:
            raise InvalidRequestError(
                f"workspace_transport must be one of {', '.join(WORKSPACE_TRANSPORTS)}, not {mode!r}"
            )
        return mode

    @field_validator("mirror_size_mb", mode="before")
    @classmethod
    def _mirror_size(cls, size: object) -> object:
        # Before pydantic's own int check, which would take "64" or 64.0 (the size must be an int).
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_TMPFS_MB:
            raise InvalidRequestError(f"mirror_size_mb must be an integer from 1 to {MAX_TMPFS_MB} (MiB)")
        return size

    @field_validator("image_id")
    @classmethod
    def _image_id_format(cls, image_id: str | None) -> str | None:
        if image_id is not None and not _IMAGE_ID.fullmatch(image_id):
            raise InvalidRequestError(
                "image_id must be an image id, 64 hex digits after an optional sha256: "
                f"(`docker image inspect -f '{{{{.Id}}}}' IMAGE` prints it), not {image_id!r}"
            )
        return image_id

    @field_validator("tmpfs", mode="before")
    @classmethod
    def _tmpfs_mounts(cls, tmpfs: Mapping[str, int]) -> dict[str, int]:
        return validate_tmpfs(tmpfs)  # its own strict checks, with this backend's messages

    @field_validator("extra_hosts", mode="before")
    @classmethod
    def _extra_hosts(cls, hosts: Mapping[str, str]) -> dict[str, str]:
        return validate_extra_hosts(hosts)

    @field_validator("labels", mode="before")
    @classmethod
    def _user_labels(cls, labels: Mapping[str, str]) -> dict[str, str]:
        return validate_labels(labels)

    @field_validator("pool", mode="before")
    @classmethod
    def _pool_size(cls, pool: object) -> object:
        if isinstance(pool, int) and not isinstance(pool, bool):
            return {"size": pool}
        return pool

    @field_validator("root_size_mb", mode="before")
    @classmethod
    def _root_size(cls, size: object) -> object:
        wrong = isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_TMPFS_MB
        if size is not None and wrong:
            raise InvalidRequestError(f"root_size_mb must be an integer from 1 to {MAX_TMPFS_MB} (MiB)")
        return size

    @field_validator("user")
    @classmethod
    def _user_format(cls, user: str | None) -> str | None:
        if user is not None:
            check_user(user)
        return user

    @property
    def root_cap_mb(self) -> int | None:
        """The cap on root-filesystem writes in MiB: None in the hardened profile (its root is read-only)."""
        if self.profile != "task":
            return None
        return self.root_size_mb if self.root_size_mb is not None else DEFAULT_ROOT_MB

    def _task_checks(self) -> None:
        """What the task profile cannot go with: its root is writable as root, so no host path may be."""
        if self.profile != "task":
            if self.root_size_mb is not None:
                raise InvalidRequestError(
                    "root_size_mb caps writes to a task container's root filesystem; the hardened profile's "
                    "root is read-only (use profile='task', or leave root_size_mb out)"
                )
            return
        if self.container is not None:
            raise InvalidRequestError(
                "profile='task' shapes the containers this backend creates; an attached container "
                "(container=) keeps the shape its compose file gave it"
            )
        if self.workspace_transport == "bind":
            raise InvalidRequestError(
                "profile='task' runs commands as root with set-id modes allowed, so a host workspace travels "
                "only as a copy (workspace_transport='mirror' or 'auto'): a bind mount would let the sandbox "
                "leave set-uid programs in a host directory"
            )
        writable = self.policy.read_write_paths
        if writable:
            raise PolicyNotEnforceableError(
                f"profile='task' cannot bind host paths read-write ({', '.join(writable)}): root in the "
                "sandbox could leave set-uid programs there. Allow them read-only, or pass files through "
                "the workspace"
            )

    @property
    def egress(self) -> NetworkPolicy | None:
        """The network policy of :attr:`network` (None when it is a bool)."""
        return self.network if isinstance(self.network, NetworkPolicy) else None

    def _egress_checks(self) -> None:
        """What a NetworkPolicy cannot go with: a route out, an attached container's network."""
        if self.egress is None:
            return
        if self.policy.allow_network:
            raise PolicyNotEnforceableError(
                "the SandboxPolicy allows network (Docker's bridge: a route out) and network= is a "
                "NetworkPolicy (no route out, names decided on the host): give one or the other"
            )
        if self.container is not None:
            raise PolicyNotEnforceableError(
                "a NetworkPolicy keeps the containers this backend creates on network none; an attached "
                "container (container=) has the network its compose file gave it, which this library "
                "cannot take away: give the service `network_mode: none` and create it here instead"
            )

    def _checkpoint_checks(self) -> None:
        """What ``checkpoints=True`` cannot be given with (docs/pause.md says why each)."""
        refused = {
            "container=": self.container is not None,  # not this library's container to restart
            "pool=": self.pool is not None,
            # a copy's volume is emptied at a stop
            "workspace_transport='mirror'": self.workspace_transport == "mirror",
        }
        given = [name for name, present in refused.items() if present]
        if given:
            raise PolicyNotEnforceableError(
                f"checkpoints=True cannot be given with {', '.join(given)} (docs/pause.md)"
            )
        if self.runtime not in (None, "runc", "runsc"):
            raise PolicyNotEnforceableError(
                f"checkpoints=True needs runtime='runsc' (gVisor's checkpoint) or 'runc' (CRIU's); "
                f"{self.runtime!r} has neither here (docs/pause.md)"
            )

    @model_validator(mode="after")
    def _fits_together(self) -> DockerConfig:
        """The checks between fields (after each field's own), in the order the backend always made them."""
        self._task_checks()
        self._egress_checks()
        attached = self.container is not None
        if self.workspace_transport == "mirror" and attached:
            raise InvalidRequestError(
                "workspace_transport='mirror' makes a container with a copy of the workspace; an attached "
                "container mounts the workspace itself (use 'bind' or 'auto')"
            )
        if self.tmpfs and attached:
            raise InvalidRequestError(
                "tmpfs= applies to containers this backend creates; an attached container has the "
                "mounts its compose file gives it (add them there)"
            )
        if self.extra_hosts and attached:
            raise InvalidRequestError(
                "extra_hosts= applies to containers this backend creates; an attached container keeps its "
                "own /etc/hosts"
            )
        if self.labels and attached:
            raise InvalidRequestError(
                "labels= applies to containers this backend creates; an attached container keeps its own"
            )
        overlap = tmpfs_overlap(self.tmpfs, [allowed.path for allowed in self.policy.allowed_paths])
        if overlap:
            raise InvalidRequestError(overlap)
        if self.checkpoints:
            self._checkpoint_checks()
        elif self.idle_pause_seconds is not None:
            raise PolicyNotEnforceableError(
                "idle_pause_seconds pauses a session to disk, which needs checkpoints=True (gVisor or "
                "runc; docs/pause.md)"
            )
        if self.pool is not None:
            if attached:
                raise InvalidRequestError(
                    "pool= keeps containers this backend creates; an attached container (container=) is one "
                    "shared container, not a pool"
                )
            if self.pool.max_age_seconds >= self.lifetime_seconds:
                raise InvalidRequestError(
                    f"PoolConfig.max_age_seconds ({self.pool.max_age_seconds:g}) must be below "
                    f"lifetime_seconds ({self.lifetime_seconds}): a member's expiry runs from its create"
                )
        return self

    @property
    def pinned_image(self) -> ExpectedImage | None:
        """The image id :attr:`image_id` pins, as the backend expects it (``sha256:`` prefixed); or None."""
        if self.image_id is None:
            return None
        image_id = self.image_id if self.image_id.startswith("sha256:") else f"sha256:{self.image_id}"
        return ExpectedImage(image_id, pinned=True)


def config_from_options(options: Mapping[str, Any]) -> DockerConfig:
    """The config of ``DockerBackend``'s keyword options (None: the default), raising what it always did.

    A check of the model raises its own error (:class:`InvalidRequestError`, unwrapped from pydantic's
    ``ValidationError``, or :class:`PolicyNotEnforceableError`); a value of the wrong type is an
    :class:`InvalidRequestError` naming the option.
    """
    try:
        return DockerConfig(**{name: value for name, value in options.items() if value is not None})
    except ValidationError as exc:
        for error in exc.errors():
            raised = (error.get("ctx") or {}).get("error")
            if isinstance(raised, ExecutorError):
                raise raised from None
        problems = validation_problems(exc)
        raise InvalidRequestError(f"invalid DockerBackend option: {problems}") from None
