"""Pausing a microVM: frozen in place (QMP ``stop``), or to a file on disk by QEMU's migration.

:func:`migrate_to_file` writes the machine to a file (a pause, a fork, a snapshot with processes);
:func:`start_from_file` starts a new QEMU from it, reconnecting each agent's port before the guest runs
and reseeding a fork's kernel randomness. Not with a workspace (virtiofs blocks migration). Depth:
docs/pause.md, "The microVM".
"""

from __future__ import annotations

import secrets
import shlex
import socket
import time
from pathlib import Path

from adk_sandbox.executor.backends.microvm._port import PortOpener, PortStream, read_until
from adk_sandbox.executor.backends.microvm._qemu import QemuCommand, VmProcess, qemu_command, start_vm
from adk_sandbox.executor.backends.microvm._qmp import Qmp
from adk_sandbox.executor.errors import SandboxFailedError

__all__ = ["STATE_FILE", "migrate_to_file", "start_from_file"]

#: What the guest's seed loop writes when it waits for a seed, and answers once reseeded (guest/vminit.c).
SEED_GREETING = b"\nadk-vm-seed-ready-1\n"
SEED_DONE = b"reseeded\n"
#: What the host reads of the seed port at most (the greeting, an answer): a flooding guest gets no further.
_SEED_READ_LIMIT = 4096

#: The migrated machine, in the VM's run directory.
STATE_FILE = "machine.state"
#: Bytes per second a migration to the file may go at: no throttle.
UNTHROTTLED = 1 << 40
#: How long a migration to or from the file may take.
MIGRATE_SECONDS = 120.0


def migrate_to_file(monitor: Qmp, state: Path, *, go_on: bool = False, running: bool = True) -> None:
    """Stop the VM and write the whole machine to ``state``; on failure it goes on as it was.

    ``go_on``: it goes on after a migration that succeeded too (a fork's source), else it stays stopped.
    ``running``: it runs now (else it was stopped in place, and stays so whatever happens).
    """
    if running:
        monitor.command("stop")
    try:
        # QEMU throttles a migration to 128 MiB/s by default (meant for a live one sharing a network):
        # to a local file with the VM stopped, the disk is the limit.
        monitor.command("migrate-set-parameters", {"max-bandwidth": UNTHROTTLED})
        monitor.command("migrate", {"uri": "exec:cat > " + shlex.quote(str(state))})
        status = monitor.wait_status(
            "query-migrate", {"completed", "failed", "cancelled"}, time.monotonic() + MIGRATE_SECONDS
        )
        if status != "completed":
            raise SandboxFailedError(f"QEMU's migration of the microVM to {state} ended {status}")
    except BaseException:
        if running:
            monitor.command("cont")
        raise
    if go_on and running:
        monitor.command("cont")


def start_from_file(
    spec: QemuCommand, state: Path, opener: PortOpener, users: list[str], *, reseed: bool = False
) -> tuple[VmProcess, Qmp, dict[str, PortStream]]:
    """A new QEMU loading ``state``, each of ``users``' ports connected, running; its monitor and streams.

    ``reseed``: a copy of another VM (a fork): its kernel's generator takes fresh randomness from the host
    as it starts to run, and it is handed out only once the guest says so (else it is killed).
    """
    incoming = "exec:cat " + shlex.quote(str(state))
    for stale in [spec.qmp_socket, *(spec.port_socket(n) for n in range(1, spec.ports + 1))]:
        stale.unlink(missing_ok=True)  # the killed QEMU's: the new one's are waited for below
    vm = start_vm(spec, [*qemu_command(spec), "-S", "-incoming", incoming])
    until = time.monotonic() + MIGRATE_SECONDS
    streams: dict[str, PortStream] = {}
    monitor: Qmp | None = None
    seed: socket.socket | None = None
    sockets = [*(spec.port_socket(n) for n in range(1, spec.ports + 1)), spec.seed_socket]
    try:
        while not all(path.exists() for path in sockets):
            if vm.finished() or time.monotonic() >= until:
                raise SandboxFailedError(
                    f"the microVM could not be restored from {state}: QEMU "
                    f"{'exited' if vm.finished() else 'did not listen in time'} ({vm.qemu_log_tail()})"
                )
            time.sleep(0.01)
        for user in users:  # before the guest runs: it never sees its agents' ports closed
            streams[user] = opener.reconnect(user, until)
        if reseed:
            seed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            seed.connect(str(spec.seed_socket))
        monitor = Qmp(spec.qmp_socket, until)
        monitor.wait_status("query-status", {"paused"}, until)  # loaded (-S keeps it stopped)
        monitor.command("cont")
        if seed is not None:
            _reseed(seed, until)
        return vm, monitor, streams
    except BaseException:
        for stream in streams.values():
            stream.close()
        if monitor is not None:
            monitor.close()
        vm.kill()
        raise
    finally:
        if seed is not None:
            seed.close()


def _reseed(seed: socket.socket, until: float) -> None:
    """Give the guest's seed loop fresh bytes and wait for its answer (see the module docstring)."""
    what = "the fork's seed port"
    read_until(seed, SEED_GREETING, until, what, limit=_SEED_READ_LIMIT)
    seed.sendall(secrets.token_bytes(32))
    answer = read_until(seed, b"\n", until, what, limit=_SEED_READ_LIMIT)
    if not answer.endswith(SEED_DONE):
        said = answer[-64:].decode("ascii", "replace").strip()
        raise SandboxFailedError(f"the fork's kernel could not take fresh randomness (its init: {said!r})")
