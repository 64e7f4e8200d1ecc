"""How a :class:`~adk_sandbox.executor.backends.microvm.MicroVMBackend` makes each session's VM."""

from __future__ import annotations

import math
import posixpath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adk_sandbox.executor.backends.microvm._share import check_guest_path
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.network.policy import NetworkPolicy, network_setting
from adk_sandbox.executor.pool import PoolSettings
from adk_sandbox.executor.types import ResourceLimits, parse_user

__all__ = ["MicroVMConfig", "MicroVMPoolConfig"]

#: The image whose filesystem is the VM's root disk (exported once, docs/MICROVM.md).
DEFAULT_IMAGE = "adk-sandbox/base:latest"
#: Where a pooled VM's workspace is inside the guest (``MicroVMPoolConfig.path``).
DEFAULT_POOL_PATH = "/workspace"


class MicroVMConfig(BaseModel):
    """One VM per session: its size, its root disk, its accelerator and its deadlines (docs/MICROVM.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["microvm"] = "microvm"
    """Discriminator, for configs that choose a backend by type."""
    image: str = DEFAULT_IMAGE
    """The image whose filesystem becomes the VM's read-only root disk (needs the Docker engine once)."""
    limits: ResourceLimits = Field(default_factory=lambda: ResourceLimits(memory_mb=512, cpus=1, pids=512))
    """``memory_mb``: the guest cgroup's limit over every command (the VM gets a fixed overhead more);
    ``cpus``: the vCPUs (a whole number); ``pids``: the guest cgroup's process limit; ``tmpfs_mb``: the size
    of ``/tmp`` and HOME (guest tmpfs, inside the VM's memory)."""
    accel: Literal["auto", "tcg", "kvm"] = "auto"
    """``"kvm"``: hardware virtualisation, refused (``PolicyNotEnforceableError``) where a probe boot under
    KVM does not succeed; ``"tcg"``: QEMU's emulation (slow: guest CPU 5-15x slower than native);
    ``"auto"``: KVM when its probe boot succeeds, else TCG (``capabilities().accel`` says which)."""
    user: str = "1000:1000"
    """Who commands run as, ``"uid:gid"`` (numbers: the guest has the image's ``/etc/passwd``)."""
    boot_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 30.0
    """How long a boot may take until the guest answers; past it QEMU is killed and the start fails."""
    ports: Annotated[int, Field(ge=1, le=16)] = 4
    """virtio-serial ports of the VM: agents that can run at once (one per user), used in turn."""
    kernel_args: tuple[str, ...] = ()
    """Appended to the guest kernel's command line (diagnostics; later words win)."""
    network: Literal[False] | NetworkPolicy = False
    """``False``: nothing leaves the VM (it has no network device at all). A
    :class:`~adk_sandbox.executor.network.NetworkPolicy` (or a mapping of its fields): still no device;
    commands reach the names it allows through the agent's proxy on the guest's ``127.0.0.1``, carried over
    the agent channel to this host, which decides, resolves and connects (docs/network.md).
    ``session.set_network`` changes it at run time. ``True`` (a route out) is refused: a VM without a NIC
    cannot be given one."""
    guest_aslr: Literal["auto", "on", "off"] = "auto"
    """Address-space randomisation of the guest's processes (the guest kernel's own, KASLR, is not
    affected). ``"auto"``: on under KVM, off under TCG, where QEMU 7.2 translates the guest's code per
    virtual address, so every process's randomly placed ``ld.so`` and libc are translated afresh (a
    dynamically linked ``true`` costs ~40 ms with it, ~10 ms without; docs/MICROVM.md, "Per command").
    ``"on"`` is checked in the guest at every start (refused with ``PolicyNotEnforceableError`` if off)."""

    idle_pause_seconds: Annotated[float, Field(gt=0)] | None = None
    """Pause a session to disk once, for this long, no call of it reached inside and its QEMU used next to
    no CPU (docs/pause.md, "Idle pause"); the next call resumes it. A session with a workspace cannot be
    paused to disk (virtiofs cannot be migrated): asking for both is refused. None: never."""

    @field_validator("network", mode="before")
    @classmethod
    def _no_route(cls, network: object) -> object:
        if network is True:
            raise ValueError(
                "network=True would need a network device, and a microVM has none: give a NetworkPolicy "
                "(allow=[...]) to reach named hosts through the agent's proxy, or False"
            )
        return network_setting(network)

    @field_validator("limits")
    @classmethod
    def _whole_cpus(cls, limits: ResourceLimits) -> ResourceLimits:
        if limits.cpus != math.floor(limits.cpus):
            raise ValueError(
                f"a microVM has whole vCPUs: limits.cpus must be a whole number, not {limits.cpus:g} (a "
                "fraction of a CPU would not be enforced)"
            )
        if limits.cpus > 64:
            raise ValueError(f"at most 64 vCPUs, not {limits.cpus:g}")
        return limits

    @field_validator("user")
    @classmethod
    def _numeric_user(cls, user: str) -> str:
        uid, gid = parse_user(user)  # ValueError for names: the guest is not asked before it boots
        return f"{uid}:{gid if gid is not None else uid}"

    @field_validator("kernel_args")
    @classmethod
    def _plain_words(cls, words: tuple[str, ...]) -> tuple[str, ...]:
        for word in words:
            if not word or any(c.isspace() for c in word) or '"' in word:
                raise ValueError(f"kernel_args must be single words without quotes, not {word!r}")
        return words

    @property
    def vcpus(self) -> int:
        """The VM's vCPUs."""
        return max(1, int(self.limits.cpus))


class MicroVMPoolConfig(PoolSettings):
    """How ``MicroVMBackend(pool=...)`` keeps booted VMs ready (docs/MICROVM.md, "The pool").

    Each member is a booted VM sharing a fresh, empty host directory of its own at :attr:`path` inside;
    ``backend.session()`` takes a member as it is, ``backend.session(copy_of=SRC)`` copies ``SRC`` into the
    member's directory first. A member is never handed out twice: closing its session kills the VM and
    removes the directory. The fields are every pool's (:class:`~adk_sandbox.executor.pool.PoolSettings`)
    and the VM's.
    """

    size: Annotated[int, Field(ge=1, le=64)]
    """How many booted VMs to keep ready."""
    path: str = DEFAULT_POOL_PATH
    """Where each member's workspace is inside its VM (the same for every member; its host directory is
    its own, below the pool's directory)."""
    copy_size_mb: Annotated[int, Field(ge=1)] = 1024
    """The largest ``copy_of`` tree taken (the copy lives in host memory when ``/dev/shm`` is a tmpfs);
    a larger one is refused with ``PolicyNotEnforceableError`` before anything is copied."""
    boot_concurrency: Annotated[int, Field(ge=1, le=16)] = 1
    """At most this many members booting at once (each boot takes a core under TCG)."""
    acquire_timeout_seconds: Annotated[float, Field(gt=0)] = 300.0
    """How long a session waits for a member when none is ready before it fails."""
    ping_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    """How long a member's agent may take to answer before the member is replaced instead of handed out."""

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            raise ValueError(f"must be an absolute, normalised directory path other than /, not {path!r}")
        try:
            return check_guest_path(path)
        except InvalidRequestError as exc:
            raise ValueError(str(exc)) from exc
