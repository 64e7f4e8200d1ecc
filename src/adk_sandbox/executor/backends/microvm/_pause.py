"""Pausing a microVM: frozen in place (QMP ``stop``), or to a file on disk by QEMU's migration.

:func:`migrate_out` sends the whole machine to a migration URI: a file (:func:`migrate_to_file`: a pause, a
fork of a paused VM, a snapshot with processes), or the socket a running VM's fork listens on (streamed,
no file). :func:`start_incoming` starts a new QEMU waiting for a machine, has it sent, reconnects each
agent's port before the guest runs and reseeds a fork's kernel randomness; :func:`start_from_file` is it
for a file. Not with a workspace (virtiofs blocks migration). Depth: docs/pause.md, "The microVM".
"""

from __future__ import annotations

import secrets
import shlex
import socket
import time
from collections.abc import Callable
from pathlib import Path

from adk_sandbox.executor.backends.microvm._port import PortOpener, PortStream, read_until
from adk_sandbox.executor.backends.microvm._qemu import QemuCommand, VmProcess, qemu_command, start_vm
from adk_sandbox.executor.backends.microvm._qmp import Qmp
from adk_sandbox.executor.errors import SandboxFailedError

__all__ = [
    "STATE_FILE",
    "incoming_uri",
    "migrate_out",
    "migrate_to_file",
    "start_from_file",
    "start_incoming",
]

#: What the guest's seed loop writes when it waits for a seed, and answers once reseeded (guest/vminit.c).
SEED_GREETING = b"\nadk-vm-seed-ready-1\n"
SEED_DONE = b"reseeded\n"
#: What the host reads of the seed port at most (the greeting, an answer): a flooding guest gets no further.
_SEED_READ_LIMIT = 4096

#: The migrated machine, in the VM's run directory.
STATE_FILE = "machine.state"
#: The socket a running VM's fork takes the machine in on, in the fork's run directory.
MIGRATE_SOCKET = "migrate.sock"
#: Bytes per second a migration may go at: no throttle.
UNTHROTTLED = 1 << 40
#: How long a migration out, or a new QEMU's load of the machine, may take.
MIGRATE_SECONDS = 120.0


def incoming_uri(spec: QemuCommand, state: Path | None) -> str:
    """Where a new QEMU of ``spec`` takes its machine from: the file ``state``; None: a socket it listens on.

    The socket (in its run directory) is for a running VM's fork: the parent migrates into it, no file.
    """
    if state is None:
        return f"unix:{spec.run_dir / MIGRATE_SOCKET}"
    return "exec:cat " + shlex.quote(str(state))


def migrate_to_file(monitor: Qmp, state: Path, *, go_on: bool = False, running: bool = True) -> None:
    """Stop the VM and write the whole machine to ``state`` (see :func:`migrate_out`)."""
    migrate_out(monitor, "exec:cat > " + shlex.quote(str(state)), go_on=go_on, running=running)


def migrate_out(monitor: Qmp, uri: str, *, go_on: bool = False, running: bool = True) -> None:
    """Stop the VM and send the whole machine to ``uri``; on failure it goes on as it was.

    ``go_on``: it goes on after a migration that succeeded too (a fork's source), else it stays stopped.
    ``running``: it runs now (else it was stopped in place, and stays so whatever happens).
    """
    if running:
        monitor.command("stop")
    try:
        # QEMU throttles a migration to 128 MiB/s by default (meant for a live one sharing a network):
        # to a local file or socket with the VM stopped, the disk or the loading QEMU is the limit.
        monitor.command("migrate-set-parameters", {"max-bandwidth": UNTHROTTLED})
        monitor.command("migrate", {"uri": uri})
        status = monitor.wait_status(
            "query-migrate", {"completed", "failed", "cancelled"}, time.monotonic() + MIGRATE_SECONDS
        )
        if status != "completed":
            said = str((monitor.command("query-migrate") or {}).get("error-desc", "no reason given"))
            raise SandboxFailedError(
                f"QEMU's migration of the microVM to {uri} ended {status} ({said}); the VM goes on as it was"
            )
    except BaseException:
        if running:
            monitor.command("cont")
        raise
    if go_on and running:
        monitor.command("cont")


def start_from_file(
    spec: QemuCommand, state: Path, opener: PortOpener, users: list[str], *, reseed: bool = False
) -> tuple[VmProcess, Qmp, dict[str, PortStream]]:
    """A new QEMU loading ``state``, each of ``users``' ports connected, running: :func:`start_incoming`."""
    incoming = incoming_uri(spec, state)
    return start_incoming(spec, incoming, opener, lambda: users, reseed=reseed, source=str(state))


def start_incoming(
    spec: QemuCommand,
    incoming: str,
    opener: PortOpener,
    send: Callable[[], list[str]],
    *,
    reseed: bool = False,
    source: str = "its source",
) -> tuple[VmProcess, Qmp, dict[str, PortStream]]:
    """A new QEMU taking its machine from ``incoming``, each agent's port connected, running.

    ``send`` is called once the QEMU listens: it has the machine sent (a file is read by QEMU itself; a
    running VM's fork migrates its parent into :func:`incoming_uri`'s socket) and says whose agents'
    ports (users) to connect again. Those are connected before the guest runs (``-S`` holds it until
    ``cont``), so it never sees its agents' ports closed. ``reseed``: a copy of another VM (a fork): its
    kernel's generator takes fresh randomness from the host as it starts to run, and it is handed out
    only once the guest says so. On any failure the new QEMU is killed. ``source``: the machine's origin,
    for errors.
    """
    for stale in [spec.qmp_socket, *(spec.port_socket(n) for n in range(1, spec.ports + 1))]:
        stale.unlink(missing_ok=True)  # the killed QEMU's: the new one's are waited for below
    vm = start_vm(spec, [*qemu_command(spec), "-S", "-incoming", incoming])
    until = time.monotonic() + MIGRATE_SECONDS
    streams: dict[str, PortStream] = {}
    monitor: Qmp | None = None
    seed: socket.socket | None = None
    try:
        _wait_listening(vm, spec, until, source)
        # Its monitor answers once QEMU's set-up is done, the incoming side listening among it: only
        # then may a machine be sent to a socket.
        monitor = Qmp(spec.qmp_socket, until)
        try:
            users = send()
        except SandboxFailedError as exc:
            if not vm.finished():
                raise
            raise SandboxFailedError(f"{exc}; the new QEMU had exited ({vm.qemu_log_tail()})") from exc
        until = time.monotonic() + MIGRATE_SECONDS  # sending may have waited on the parent's calls
        for user in users:  # before the guest runs: it never sees its agents' ports closed
            streams[user] = opener.reconnect(user, until)
        if reseed:
            seed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            seed.connect(str(spec.seed_socket))
        # "inmigrate" while loading; with -S, "paused" once the whole machine is in (a failed load ends
        # QEMU: its monitor closes, an error here).
        monitor.wait_status("query-status", {"paused"}, until)
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


def _wait_listening(vm: VmProcess, spec: QemuCommand, until: float, source: str) -> None:
    """Wait for the new QEMU's port sockets (the agents' and the seed's); refused if it exits or is late."""
    sockets = [*(spec.port_socket(n) for n in range(1, spec.ports + 1)), spec.seed_socket]
    while not all(path.exists() for path in sockets):
        if vm.finished() or time.monotonic() >= until:
            raise SandboxFailedError(
                f"the microVM could not be restored from {source}: QEMU "
                f"{'exited' if vm.finished() else 'did not listen in time'} ({vm.qemu_log_tail()})"
            )
        time.sleep(0.01)


def _reseed(seed: socket.socket, until: float) -> None:
    """Give the guest's seed loop fresh bytes and wait for its answer (see the module docstring)."""
    what = "the fork's seed port"
    read_until(seed, SEED_GREETING, until, what, limit=_SEED_READ_LIMIT)
    seed.sendall(secrets.token_bytes(32))
    answer = read_until(seed, b"\n", until, what, limit=_SEED_READ_LIMIT)
    if not answer.endswith(SEED_DONE):
        said = answer[-64:].decode("ascii", "replace").strip()
        raise SandboxFailedError(f"the fork's kernel could not take fresh randomness (its init: {said!r})")
