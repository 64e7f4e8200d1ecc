"""How a :class:`~adk_sandbox.executor.backends.microvm.MicroVMBackend` makes each session's VM."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adk_sandbox.executor.types import ResourceLimits, parse_user

__all__ = ["MicroVMConfig"]

#: The image whose filesystem is the VM's root disk (exported once, docs/MICROVM.md).
DEFAULT_IMAGE = "adk-sandbox/base:latest"


class MicroVMConfig(BaseModel):
    """One VM per session: its size, its root disk, its accelerator and its deadlines (docs/MICROVM.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
