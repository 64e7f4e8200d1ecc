"""Pausing a microVM: frozen in place (QMP ``stop``), or to a file on disk by QEMU's migration.

**In place** (``pause(keep_memory=True)``): the vCPUs stop; the guest's memory stays in QEMU; ``cont``
goes on. **To disk** (``pause()``): the vCPUs stop, QEMU migrates the whole machine (memory, devices, the
virtio-serial ports' state) to a file in the VM's run directory (``exec:cat > file``: QEMU 7.2 has no
``file:`` migration), and QEMU is killed: the host holds the file and nothing else of the VM. A resume
starts a new QEMU with the same command line, stopped (``-S``), loading that file (``-incoming``); the host
connects to each running agent's port *before* the guest runs again, so the guest never sees its ports
closed (a port closed while the guest runs ends its agent's input); then ``cont``, and each agent is
served again over its new socket (it answers a PING).

Not with a workspace: virtiofs (vhost-user-fs) is a migration blocker in QEMU 7.2.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from adk_sandbox.executor.backends.microvm._port import PortOpener, PortStream
from adk_sandbox.executor.backends.microvm._qemu import QemuCommand, VmProcess, qemu_command, start_vm
from adk_sandbox.executor.backends.microvm._qmp import Qmp
from adk_sandbox.executor.errors import SandboxFailedError

__all__ = ["STATE_FILE", "migrate_to_file", "start_from_file"]

#: The migrated machine, in the VM's run directory.
STATE_FILE = "machine.state"
#: How long a migration to or from the file may take.
MIGRATE_SECONDS = 120.0


def migrate_to_file(monitor: Qmp, state: Path) -> None:
    """Stop the VM and write the whole machine to ``state``; on failure it goes on as it was."""
    monitor.command("stop")
    try:
        monitor.command("migrate", {"uri": "exec:cat > " + shlex.quote(str(state))})
        status = monitor.wait_status(
            "query-migrate", {"completed", "failed", "cancelled"}, time.monotonic() + MIGRATE_SECONDS
        )
        if status != "completed":
            raise SandboxFailedError(f"QEMU's migration of the microVM to {state} ended {status}")
    except BaseException:
        monitor.command("cont")
        raise


def start_from_file(
    spec: QemuCommand, state: Path, opener: PortOpener, users: list[str]
) -> tuple[VmProcess, Qmp, dict[str, PortStream]]:
    """A new QEMU loading ``state``, each of ``users``' ports connected, running; its monitor and streams."""
    incoming = "exec:cat " + shlex.quote(str(state))
    for stale in [spec.qmp_socket, *(spec.port_socket(n) for n in range(1, spec.ports + 1))]:
        stale.unlink(missing_ok=True)  # the killed QEMU's: the new one's are waited for below
    vm = start_vm(spec, [*qemu_command(spec), "-S", "-incoming", incoming])
    until = time.monotonic() + MIGRATE_SECONDS
    streams: dict[str, PortStream] = {}
    monitor: Qmp | None = None
    try:
        while not all(spec.port_socket(n).exists() for n in range(1, spec.ports + 1)):
            if vm.finished() or time.monotonic() >= until:
                raise SandboxFailedError(
                    f"the microVM could not be restored from {state}: QEMU "
                    f"{'exited' if vm.finished() else 'did not listen in time'} ({vm.qemu_log_tail()})"
                )
            time.sleep(0.01)
        for user in users:  # before the guest runs: it never sees its agents' ports closed
            streams[user] = opener.reconnect(user, until)
        monitor = Qmp(spec.qmp_socket, until)
        monitor.wait_status("query-status", {"paused"}, until)  # loaded (-S keeps it stopped)
        monitor.command("cont")
        return vm, monitor, streams
    except BaseException:
        for stream in streams.values():
            stream.close()
        if monitor is not None:
            monitor.close()
        vm.kill()
        raise
