"""A microVM's snapshot with processes: its machine file kept in the snapshot store.

:func:`take_machine` migrates the VM into ``checkpoint/machine.state`` beside a ``machine.json``
(:class:`KeptMachine`); :func:`read_machine` checks it fits the machine a backend makes before a session
starts from it. Depth: docs/pause.md, "The microVM" (``snapshot(processes=True)``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adk_sandbox.executor.backends.microvm._pause import STATE_FILE
from adk_sandbox.executor.backends.microvm._qemu import QemuCommand
from adk_sandbox.executor.channel.agent_transport import DetachedAgent
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.snapshots.model import KeptEndpoint, Snapshot, SnapshotOptions, new_record
from adk_sandbox.executor.snapshots.store import SnapshotStore, new_id

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.microvm.backend import MicroVMSession

__all__ = ["KeptMachine", "read_machine", "take_machine"]

MACHINE_RECORD = "machine.json"
_MIB = 1024 * 1024
#: What of a VM's command line its migration file must meet again (the rest is the run directory's).
_MACHINE_FIELDS = ("kernel", "initramfs", "rootfs", "memory_mb", "vcpus", "pids", "tmpfs_mb", "ports", "aslr")


class KeptAgent(BaseModel):
    """One agent running in the kept machine, and the port it is served on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: Annotated[str, Field(pattern=r"^[0-9]{1,10}:[0-9]{1,10}$")]
    hello: dict[str, Any]
    numbering: tuple[int, int, int]
    port: Annotated[int, Field(ge=0, le=63)]
    """The 0-based index of its virtio-serial port."""


class KeptMachine(BaseModel):
    """``checkpoint/machine.json``: the agents of the kept machine and what its file fits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agents: tuple[KeptAgent, ...]
    accel: Literal["tcg", "kvm"]
    machine: dict[str, str]
    """The command line's :data:`_MACHINE_FIELDS`, as text."""
    probe: str
    """What the start-up probe said in the VM (its kernel, limits, languages)."""
    endpoint: KeptEndpoint | None = None
    """The proxy endpoint its agent holds: a session from it serves it under its own network."""


def _machine_of(spec: QemuCommand) -> dict[str, str]:
    return {name: str(getattr(spec, name)) for name in _MACHINE_FIELDS}


def take_machine(session: MicroVMSession, options: SnapshotOptions, store: SnapshotStore) -> Snapshot:
    """Snapshot ``session``'s whole VM into ``store`` (see the module docstring); over the cap, refused."""
    snapshot_id, created = new_id(), time.time()

    def build(partial: str) -> Snapshot:
        kept = Path(partial) / "checkpoint"
        kept.mkdir(mode=0o700)
        agents, spec, carried = session._copy_machine(
            kept / STATE_FILE, options.wait_seconds, "a snapshot is taken"
        )
        size = sum(os.lstat(path).st_blocks * 512 for path in kept.iterdir())
        if size > options.max_mb * _MIB:
            raise PolicyNotEnforceableError(
                f"the snapshot would hold {size // _MIB} MiB (the VM's whole memory and devices), more than "
                f"its cap of {options.max_mb} MiB; nothing was taken and nothing is left of it. Take it with "
                "a larger max_mb, or a VM with less memory"
            )
        port_of = session.ports_of_agents()
        record = KeptMachine(
            agents=tuple(
                KeptAgent(user=one.user, hello=one.hello, numbering=one.numbering, port=port_of[one.user])
                for one in agents
            ),
            accel="kvm" if spec.accel == "kvm" else "tcg",
            machine=_machine_of(spec),
            probe=session.guest.output if session.guest is not None else "",
            endpoint=carried,
        )
        (kept / MACHINE_RECORD).write_text(record.model_dump_json(indent=1), encoding="utf-8")
        return new_record(
            options,
            snapshot_id,
            created,
            backend="microvm",
            image=session.image,
            image_id=spec.rootfs.parent.name,
            profile="microvm",
            size_bytes=size,
            carries=("files", "processes", "memory"),
        )

    # On disk whatever the options say: the memory tier would make it host memory again.
    return store.take(snapshot_id, build, durable=True)


def read_machine(
    snapshot: Snapshot, spec_for: Callable[[str], QemuCommand]
) -> tuple[KeptMachine, list[DetachedAgent], Path]:
    """The kept machine of ``snapshot``, its agents and its file.

    Refused unless it fits the VM this backend makes with the kept accelerator (``spec_for(accel)``).
    """
    if snapshot.backend != "microvm":
        raise InvalidRequestError(
            f"snapshot {snapshot.id} was taken of a {snapshot.backend} session: start it on that backend"
        )
    kept = Path(snapshot.checkpoint_dir)
    try:
        record = KeptMachine.model_validate_json((kept / MACHINE_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise InvalidRequestError(f"snapshot {snapshot.id} has no readable machine record ({exc})") from exc
    now = _machine_of(spec_for(record.accel))
    differ = [
        f"{name} {record.machine.get(name)} (now {value})"
        for name, value in now.items()
        if record.machine.get(name) != value
    ]
    if differ:
        raise InvalidRequestError(
            f"snapshot {snapshot.id} holds a VM this backend does not make: {'; '.join(differ)}. Its memory "
            "fits only the machine it was taken of: start it on a backend with the same settings and image"
        )
    agents = [DetachedAgent(a.user, dict(a.hello), a.numbering, resident=False) for a in record.agents]
    return record, agents, kept / STATE_FILE
