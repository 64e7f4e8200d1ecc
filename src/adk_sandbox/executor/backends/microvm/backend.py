"""MicroVMBackend: one QEMU ``-M microvm`` VM per session, commands through the static agent.

:class:`MicroVMBackend` opens a :class:`MicroVMSession` per session: no network device, limits enforced by a
guest cgroup and the VM's size, commands over the agent channel on a virtio-serial port; capabilities are read
from the QEMU command line and an in-guest probe. Depth: docs/MICROVM.md.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from adk_sandbox.executor._languages import LANGUAGES
from adk_sandbox.executor._layout import HOME_DIR
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backend import SessionBackend, check_one_source
from adk_sandbox.executor.backends.microvm._guest import (
    GuestParts,
    fsjail,
    guest_parts,
    microvm_cache,
    virtiofsd,
)
from adk_sandbox.executor.backends.microvm._pause import (
    STATE_FILE,
    incoming_uri,
    migrate_out,
    migrate_to_file,
    start_from_file,
    start_incoming,
)
from adk_sandbox.executor.backends.microvm._port import PortOpener
from adk_sandbox.executor.backends.microvm._qemu import (
    QemuCommand,
    Share,
    VmProcess,
    fs_command,
    host_tsc_khz,
    qemu_command,
    start_vm,
)
from adk_sandbox.executor.backends.microvm._qmp import Qmp
from adk_sandbox.executor.backends.microvm._reaper import reap_vms, run_dir_prefix
from adk_sandbox.executor.backends.microvm._share import plan_share
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig, MicroVMPoolConfig
from adk_sandbox.executor.backends.microvm.pool import MicroVMPool
from adk_sandbox.executor.channel.agent_transport import AgentTransport, DetachedAgent
from adk_sandbox.executor.channel.egress import SessionEgress, SessionNetwork, check_network_argument
from adk_sandbox.executor.channel.idle import IdlePauser, process_cpu_reader
from adk_sandbox.executor.channel.probe import verify_from_inside
from adk_sandbox.executor.channel.session import ChannelSession
from adk_sandbox.executor.channel.streams import AgentStream
from adk_sandbox.executor.channel.transport import DEFAULT_PATH, PreparedCommand
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.types import Capabilities, IsolationClass, Language
from adk_sandbox.executor.workspace.copies import reap_copies

if TYPE_CHECKING:
    from adk_sandbox.executor.snapshots.model import KeptEndpoint, Snapshot, SnapshotOptions
    from adk_sandbox.executor.snapshots.store import SnapshotStore

__all__ = ["GuestFacts", "MicroVMBackend", "MicroVMSession", "resolve_accel"]

log = logging.getLogger(__name__)

#: Why a VM with a workspace is never migrated (paused to disk, forked, snapshotted).
NO_MIGRATION = "QEMU 7.2 cannot migrate its virtiofs share (vhost-user-fs is a migration blocker)"
#: How long a probe boot under KVM may take before KVM is judged not to work here.
KVM_PROBE_SECONDS = 10.0
_PROGRAM_LANGUAGES = {LANGUAGES[lang].program: lang for lang in (Language.PYTHON, Language.JAVASCRIPT)}
# What the guest says about itself: its kernel, its interfaces, its cgroup's limits, its CPUs, its languages.
_PROBE = (
    "echo kernel=$(uname -r); echo net=$(ls /sys/class/net | tr '\\n' ' '); "
    "echo memory=$(cat /sys/fs/cgroup/memory.max); echo pids=$(cat /sys/fs/cgroup/pids.max); "
    "echo cpus=$(nproc); echo aslr=$(cat /proc/sys/kernel/randomize_va_space); "
    f"for p in {' '.join(_PROGRAM_LANGUAGES)}; do "
    "command -v $p >/dev/null 2>&1 && echo language=$p; done; true"
)
_LIVE: weakref.WeakSet[MicroVMSession] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit every VM still open goes (the lifeline would end them anyway)."""
    for session in list(_LIVE):
        with contextlib.suppress(Exception):
            session.close()


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` holding ``source``'s machine file: a hard link, else a copy.

    A copy where they are on two file systems (a snapshot store elsewhere than the run directories).
    """
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)


@dataclasses.dataclass(frozen=True)
class _Copied:
    """What a copy of a VM takes besides its machine: its agents, an agent's proxy endpoint, their ports."""

    agents: list[DetachedAgent]
    carried: KeptEndpoint | None
    port_of: dict[str, int]


class GuestFacts:
    """What the in-guest probe found (kernel release, interfaces, limits, CPUs, languages)."""

    def __init__(self, output: str) -> None:
        self.output = output
        """The probe's answer as it came (kept in a snapshot of the VM)."""
        fields: dict[str, str] = {}
        languages: list[Language] = []
        for line in output.splitlines():
            name, _, value = line.partition("=")
            if name == "language" and value in _PROGRAM_LANGUAGES:
                languages.append(_PROGRAM_LANGUAGES[value])
            elif name:
                fields[name] = value.strip()
        self.kernel = fields.get("kernel", "")
        self.interfaces = tuple(sorted(fields.get("net", "").split()))
        self.memory_max = fields.get("memory", "")
        self.pids_max = fields.get("pids", "")
        self.cpus = int(fields["cpus"]) if fields.get("cpus", "").isdigit() else 0
        self.aslr = fields.get("aslr", "") not in ("", "0")
        """Whether the guest randomises its processes' address spaces (``randomize_va_space`` not 0)."""
        self.languages = tuple(languages)


def _vm_spec(
    parts: GuestParts, config: MicroVMConfig, accel: str, run_dir: Path, share: Share | None = None
) -> QemuCommand:
    return QemuCommand(
        kernel=parts.kernel,
        initramfs=parts.initramfs,
        rootfs=parts.rootfs,
        run_dir=run_dir,
        accel=accel,
        memory_mb=config.limits.memory_mb,
        vcpus=config.vcpus,
        pids=config.limits.pids,
        tmpfs_mb=config.limits.tmpfs_mb,
        ports=config.ports,
        tsc_khz=host_tsc_khz(),
        kernel_args=config.kernel_args,
        aslr=guest_aslr(config, accel),
        share=share,
    )


def guest_aslr(config: MicroVMConfig, accel: str) -> bool:
    """Whether the guest's processes get randomised address spaces (``MicroVMConfig.guest_aslr``)."""
    return config.guest_aslr == "on" or (config.guest_aslr == "auto" and accel == "kvm")


def boot(
    spec: QemuCommand,
    opener: PortOpener,
    deadline: float,
    started: Callable[[VmProcess], None] | None = None,
) -> VmProcess:
    """Start the VM of ``spec`` and wait for its guest init to greet on port 1 by ``deadline``.

    Past the deadline, or when QEMU stops first, the VM is killed and :class:`BackendUnavailableError`
    says why, with the end of the guest's console. ``started`` is called with the VM as soon as QEMU runs
    (so that a close from another thread can kill a VM still booting).
    """
    server = fs_command(spec, fsjail(), virtiofsd()) if spec.share is not None else []
    vm = start_vm(spec, qemu_command(spec), server)
    try:
        if started is not None:
            started(vm)
        socket_path = spec.port_socket(1)
        while not socket_path.exists():
            if vm.finished():
                raise BackendUnavailableError(_stopped(vm, "QEMU exited before it listened on its ports"))
            if time.monotonic() >= deadline:
                raise BackendUnavailableError(_late(vm, spec))
            time.sleep(0.01)
        try:
            opener.connect(0, deadline).close()
        except SandboxFailedError as exc:
            until = min(deadline, time.monotonic() + 2)
            while not vm.finished() and time.monotonic() < until:  # a closed port: QEMU is exiting
                time.sleep(0.05)
            if vm.finished():
                raise BackendUnavailableError(_stopped(vm, "the VM stopped during its boot")) from exc
            raise BackendUnavailableError(_late(vm, spec)) from exc
        opener.skip(0)  # the next agent takes another port than the one just greeted and dropped
        return vm
    except BaseException:
        vm.kill()
        raise


def _late(vm: VmProcess, spec: QemuCommand) -> str:
    tail = vm.console_tail()
    server = vm.qemu_log_tail()  # QEMU's and virtiofsd's own errors
    return (
        f"the microVM did not boot within its deadline (MicroVMConfig(boot_timeout_seconds=...), accel "
        f"{spec.accel}); QEMU was killed. Its console ended with:\n{tail or '(nothing)'}"
        + (f"\nQEMU and the share's server said:\n{server}" if server else "")
    )


def _stopped(vm: VmProcess, what: str) -> str:
    tail = vm.console_tail() or vm.qemu_log_tail() or "(nothing)"
    return f"{what}. QEMU or the guest said:\n{tail}"


# -- the accelerator -----------------------------------------------------------------------------------
def _kvm_probe_key(parts: GuestParts) -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "unknown"
    digest = hashlib.sha256(
        f"{boot_id}\0{parts.kernel}\0{parts.initramfs}\0{shutil.which('qemu-system-x86_64')}".encode()
    )
    return digest.hexdigest()[:24]


@functools.cache
def _kvm_verdict(parts: GuestParts) -> str:
    """``""`` when a probe boot under KVM greets within :data:`KVM_PROBE_SECONDS`, else why not.

    Remembered in the cache for this host boot (a failing probe costs its whole deadline).
    """
    record = microvm_cache() / f"kvm-probe-{_kvm_probe_key(parts)}"
    with contextlib.suppress(OSError):
        return record.read_text()
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as exc:
        verdict = f"/dev/kvm cannot be opened ({exc.strerror})"
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="adk-sandbox-kvm-probe-"))
        try:
            config = MicroVMConfig(
                limits=MicroVMConfig().limits.model_copy(update={"memory_mb": 64}), ports=1
            )
            spec = _vm_spec(parts, config, "kvm", run_dir)
            try:
                boot(
                    spec, PortOpener([str(spec.port_socket(1))]), time.monotonic() + KVM_PROBE_SECONDS
                ).kill()
                verdict = ""
            except BackendUnavailableError as exc:
                first = str(exc).splitlines()[0]
                verdict = f"a probe boot under KVM did not answer within {KVM_PROBE_SECONDS:g} s ({first})"
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        record.write_text(verdict)
    return verdict


def resolve_accel(requested: str, parts: GuestParts) -> str:
    """``"kvm"`` or ``"tcg"`` for ``requested``; :class:`PolicyNotEnforceableError` for KVM where it fails."""
    if requested == "tcg":
        return "tcg"
    verdict = _kvm_verdict(parts)
    if not verdict:
        return "kvm"
    if requested == "kvm":
        raise PolicyNotEnforceableError(
            f"accel='kvm' was asked for, but KVM does not work on this machine: {verdict}. Nothing ran; "
            "use MicroVMConfig(accel='tcg') (emulated, 5-15x slower guest CPU) or 'auto'"
        )
    log.info("KVM does not work here (%s): microVMs run under TCG", verdict)
    return "tcg"


# -- the session -----------------------------------------------------------------------------------------
class MicroVMSession(SessionNetwork, ChannelSession):
    """One VM for the whole session: booted at entry (or first use), reused, killed at close.

    Commands run through the static agent over a virtio-serial port, as ``config.user`` or a request's
    numeric ``user``, with a cleared environment (PATH, HOME, then the request's), in the workspace (else
    HOME) by default. A ``workspace`` is shared over virtiofs at the same absolute path (:mod:`._share`).
    """

    name = "microvm"
    _GONE = "this microVM session is closed"
    _WHERE = "the session's microVM"
    _MEMORY_SETTING = "MicroVMConfig(limits=ResourceLimits(memory_mb={}))"

    def __init__(
        self,
        config: MicroVMConfig,
        workspace: str | os.PathLike[str] | None = None,
        *,
        share: Share | None = None,
    ) -> None:
        self._config = config
        self._share = plan_share(workspace, config.user) if workspace is not None else share
        if self._share is not None and config.idle_pause_seconds is not None:
            raise PolicyNotEnforceableError(
                f"idle_pause_seconds pauses a session to disk, which a microVM with a workspace cannot be "
                f"({NO_MIGRATION}): start it without a workspace, or without idle_pause_seconds"
            )
        #: Pauses the session to disk once idle (``idle_pause_seconds``), from its first start.
        self._idle: IdlePauser | None = None
        self._owns_workspace = share is not None
        """A pool member: its workspace directory was made for it and is removed at close."""
        self._booting: VmProcess | None = None
        self._workdir = self._share.guest_path if self._share is not None else HOME_DIR
        self._session_id = uuid.uuid4().hex[:12]
        self._lock = threading.RLock()
        self._closed = False
        self._vm: VmProcess | None = None
        self._run_dir: Path | None = None
        self._transport: AgentTransport | None = None
        self._capabilities: Capabilities | None = None
        self._vm_command: QemuCommand | None = None
        self._opener: PortOpener | None = None
        #: QEMU's machine protocol, opened on the first pause (see _pause.py).
        self._monitor_connection: Qmp | None = None
        #: Paused to disk: the agents let go (served again on their ports after the restore).
        self._detached: list[DetachedAgent] = []
        #: The proxy endpoint its agent held when it was let go (paused to disk): for the copies made then.
        self._carried: KeptEndpoint | None = None
        self._user = config.user
        self._base_env = {"PATH": DEFAULT_PATH, "HOME": HOME_DIR}
        self._enterable: set[tuple[str, str]] = set()
        self._egress = SessionEgress(config.network)
        self.accel: str | None = None
        """``"kvm"`` or ``"tcg"``, once started."""
        self.guest: GuestFacts | None = None
        """What the in-guest probe found at the start."""
        self.boot_seconds: float | None = None
        """From QEMU's start to the guest's first greeting."""

    @property
    def session_id(self) -> str:
        """The session's id (the name of its run directory)."""
        return self._session_id

    @property
    def workspace(self) -> Path | None:
        """The host directory shared with the VM (at the same path inside), if any."""
        return self._share.host_dir if self._share is not None else None

    @property
    def qemu_pid(self) -> int | None:
        """The pid of the wrapper whose group holds QEMU (None before the start and after the close)."""
        vm = self._vm
        return vm.pid if vm is not None else None

    def _open(self) -> None:
        """Boot the VM, start its agent, probe it (see :meth:`ChannelSession.start`)."""
        config = self._config
        parts = guest_parts(config.image)
        self.accel = resolve_accel(config.accel, parts)
        self._run_dir = Path(tempfile.mkdtemp(prefix=run_dir_prefix(self._session_id)))
        self._vm_command = spec = _vm_spec(parts, config, self.accel, self._run_dir, self._share)
        self._opener = opener = PortOpener([str(spec.port_socket(n)) for n in range(1, spec.ports + 1)])
        started = time.monotonic()
        _LIVE.add(self)
        self._vm = boot(spec, opener, started + config.boot_timeout_seconds, self._boot_started)
        self.boot_seconds = time.monotonic() - started
        self._transport = AgentTransport(opener)
        verify_from_inside(self._transport, dict(self._base_env), config.user, None)
        probe = self._run_probe()
        self.guest = facts = GuestFacts(probe)
        if facts.kernel != parts.kernel_release:
            raise PolicyNotEnforceableError(
                f"the session's commands do not run on the microVM's kernel ({parts.kernel_release}): the "
                f"probe saw {facts.kernel or 'nothing'!r}"
            )
        if guest_aslr(config, self.accel) and not facts.aslr:
            raise PolicyNotEnforceableError(
                "MicroVMConfig(guest_aslr='on') was asked for, but the guest does not randomise its "
                "processes' address spaces (a kernel_args word such as norandmaps turned it off)"
            )
        if facts.interfaces != ("lo",):
            raise PolicyNotEnforceableError(
                f"the microVM has network interfaces besides lo ({', '.join(facts.interfaces) or 'none'}); "
                "it was started without a NIC, so this is not the VM it should be"
            )
        if self._egress.proxied:
            self._egress.serve(self._transport, config.user)
        self._watch_idle()

    def _watch_idle(self) -> None:
        """Start the idle watcher once the VM runs (``idle_pause_seconds``), if not yet."""
        if self._config.idle_pause_seconds is not None and self._idle is None:
            self._idle = IdlePauser(self, self._config.idle_pause_seconds, process_cpu_reader)

    def _boot_started(self, vm: VmProcess) -> None:
        self._booting = vm
        if self._closed:  # closed from another thread while QEMU was being started
            vm.kill()

    def _run_probe(self) -> str:
        capture = OutputCapture(64 * 1024)
        command = PreparedCommand(argv=("/bin/sh", "-c", _PROBE), env=dict(self._base_env),
                                  user=self._config.user, workdir="/", stdin=None,
                                  marker=uuid.uuid4().hex)  # fmt: skip
        assert self._transport is not None  # noqa: S101 - set just before
        outcome = self._transport.run(command, capture, deadline=time.monotonic() + 60, cancel=None)
        if outcome.exit_code != 0:
            raise SandboxFailedError("the microVM's start-up probe did not finish")
        return capture.finish()["stdout"].text

    def _discard(self) -> None:
        self._egress.close()
        monitor, self._monitor_connection = self._monitor_connection, None
        if monitor is not None:
            monitor.close()
        transport, self._transport = self._transport, None
        if transport is not None:
            with contextlib.suppress(ExecutorError, OSError):
                transport.close()
        vm, self._vm = self._vm, None
        if vm is not None:
            vm.kill()
        run_dir, self._run_dir = self._run_dir, None
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        _LIVE.discard(self)

    def running_sandbox(self) -> tuple[str, int] | None:
        """The session's id and its QEMU's pid, while the VM runs (not paused to disk); else None."""
        vm = self._vm
        if vm is None or self._closed or self._on_disk:
            return None
        qemu = vm.qemu_pid()
        return (f"{self._session_id}:{vm.pid}", qemu) if qemu is not None else None

    def _close_sandbox(self) -> None:
        """Kill the VM (QEMU and its wrapper) and remove its run directory; idempotent.

        A VM still booting (in another thread) is killed at once, not waited for. A pooled session's
        workspace directory (made for it by the pool) is removed too: read results from it before.
        """
        self._closed = True
        if self._idle is not None:
            self._idle.stop()
        booting = self._booting
        if booting is not None:
            booting.kill()  # its boot() then fails at once and releases the lock
        with self._lock:
            self._discard()
            self._booting = None
            if self._owns_workspace and self._share is not None:
                shutil.rmtree(self._share.host_dir, ignore_errors=True)  # by descriptor: links not followed

    def alive(self) -> bool:
        """True while the session's VM is started and QEMU runs (no round trip into the guest)."""
        vm = self._vm
        return not self._closed and vm is not None and not vm.finished()

    def ping(self, timeout: float = 2.0) -> bool:
        """True when the VM runs and its agent answers a PING within ``timeout`` seconds; starts nothing."""
        return self.alive() and super().ping(timeout)

    # -- pause (docs/pause.md; the engine's part: _pause.py) -------------------------------------------
    def _monitor(self) -> Qmp:
        monitor = self._monitor_connection
        if monitor is None:
            assert self._vm_command is not None  # noqa: S101 - started
            monitor = Qmp(self._vm_command.qmp_socket, time.monotonic() + 30)
            self._monitor_connection = monitor
        return monitor

    def _freeze(self, wait_seconds: float) -> None:
        """Stop the VM's vCPUs where they are (QMP ``stop``): its memory stays in QEMU."""
        with self._quiesced(wait_seconds, "the session is paused"):
            self._monitor().command("stop")
            self._paused = True  # before the held calls go on: each resumes the session first

    def _checkpoint(self, wait_seconds: float) -> None:
        """Migrate the whole VM to a file in its run directory and end QEMU (see ``_pause``)."""
        if self._share is not None:
            raise PolicyNotEnforceableError(
                f"a microVM with a workspace cannot be paused to disk: {NO_MIGRATION}; nothing was paused. "
                "pause(keep_memory=True) stops it in place"
            )
        with self._quiesced(wait_seconds, "the session is paused"):
            transport, vm, run_dir = self._transport, self._vm, self._run_dir
            assert transport is not None and vm is not None and run_dir is not None  # noqa: S101 - started
            users = self._users_without_streams(
                "held through a pause to disk; nothing was paused. Close them, or pause(keep_memory=True)"
            )
            carried = self._egress.carried(transport)
            migrate_to_file(self._monitor(), run_dir / STATE_FILE)
            self._detached = [transport.detach(user) for user in users]
            self._carried = carried
            monitor, self._monitor_connection = self._monitor_connection, None
            if monitor is not None:
                monitor.close()
            vm.kill()
            self._paused = self._on_disk = True

    def _users_without_streams(self, consequence: str) -> list[str]:
        """The users whose agents run; refused while any has a program, terminal or connection open."""
        transport = self._transport
        assert transport is not None  # noqa: S101 - started
        users = transport.users()
        in_use = sum(transport.in_use(user) for user in users)
        if in_use:
            raise InvalidRequestError(
                f"{in_use} spawned program(s), terminal(s), listener(s) or connection(s) of this session are "
                f"open, and their streams cannot be {consequence}"
            )
        return users

    def _thaw(self) -> None:
        if not self._on_disk:
            self._frozen_state().unlink(missing_ok=True)
            self._monitor().command("cont")
            return
        transport, spec, opener, run_dir = self._transport, self._vm_command, self._opener, self._run_dir
        assert transport and spec and opener and run_dir  # noqa: S101 - paused to disk after a start
        users = [agent.user for agent in self._detached]
        vm, monitor, streams = start_from_file(spec, run_dir / STATE_FILE, opener, users)
        self._vm, self._monitor_connection = vm, monitor
        for agent in self._detached:  # its listeners come back with it (the transport kept them)
            transport.reattach(agent, streams[agent.user], time.monotonic() + 30)
        self._detached, self._carried = [], None
        (run_dir / STATE_FILE).unlink(missing_ok=True)

    # -- fork and snapshot with processes (docs/pause.md "The microVM"; _pause.py, _snapshot.py) ----------
    @property
    def image(self) -> str:
        """The image the VM's root disk was made from."""
        return self._config.image

    def ports_of_agents(self) -> dict[str, int]:
        """The port (0-based) each user's agent runs on."""
        opener = self._opener
        return dict(opener.port_of) if opener is not None else {}

    def fork(self, *, processes: bool = False, wait_seconds: float = 30.0) -> MicroVMSession:
        """A new session running a copy of this VM: every process where it was, with its memory.

        ``processes=True`` is required: a microVM's files are in its memory (tmpfs), so a copy without its
        processes is no cheaper. The fork's QEMU starts first, listening; the VM is stopped, migrated
        straight into it over a socket (no file) and goes on; each agent is served again over the fork's
        own ports, and its kernel's generator takes fresh randomness from the host before the fork is
        handed out (the parent's and the fork's draws differ). A paused session stays paused (in place or
        on disk), and forks of it start from the very same state, a file (pause, fork N ways, resume).
        Running calls are waited for (at most ``wait_seconds``); refused while a spawned program, terminal
        or connection is open, and with a workspace (QEMU 7.2 cannot migrate virtiofs). On failure the
        session goes on as it was, and nothing of the fork is left.
        """
        self._refuse_copy(processes, "fork", "forked")
        self.start()
        child = MicroVMSession(self._config)
        child._egress = SessionEgress(self._egress.network)  # the network in force now, not the config's
        purpose = "the session is forked"
        try:
            run_dir = child._new_run_dir()
            if self._paused:  # its one file serves every fork (see _copy_machine)
                state = run_dir / STATE_FILE
                agents, spec, carried = self._copy_machine(state, wait_seconds, purpose)
                kept = _Copied(agents, carried, self.ports_of_agents())
                child._start_copy(spec.accel, state, lambda _uri: kept, self.guest)
            else:  # running: streamed into the fork's QEMU, which listens before the VM stops

                def stream(uri: str) -> _Copied:
                    agents, _, carried = self._copy_machine(None, wait_seconds, purpose, stream_to=uri)
                    return _Copied(agents, carried, self.ports_of_agents())

                running = self._vm_command
                assert running is not None  # noqa: S101 - started
                child._start_copy(running.accel, None, stream, self.guest)
        except BaseException:
            child.close()
            raise
        return child

    def _take_snapshot(
        self, options: SnapshotOptions, store: SnapshotStore | None, processes: bool
    ) -> Snapshot:
        """See :meth:`ChannelSession.snapshot`: the whole VM, with ``processes=True`` only (as :meth:`fork`).

        It goes on (paused in place, it stays paused); each ``backend.session(snapshot=...)`` is a copy.
        """
        from adk_sandbox.executor.backends.microvm._snapshot import take_machine  # noqa: PLC0415
        from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

        self._refuse_copy(processes, "snapshot", "snapshotted")
        return take_machine(self, options, store or SnapshotStore())

    def _refuse_copy(self, processes: bool, call: str, done: str) -> None:
        if not processes:
            raise InvalidRequestError(
                f"a microVM's files live in its memory: {call}(processes=True) copies the whole VM, its "
                f"processes with it; {call}() alone has nothing cheaper to offer"
            )
        if self._share is not None:
            raise PolicyNotEnforceableError(
                f"a microVM with a workspace cannot be {done}: {NO_MIGRATION}; start the session without a "
                f"workspace to {call} it"
            )

    def _copy_machine(
        self, state: Path | None, wait_seconds: float, purpose: str, *, stream_to: str | None = None
    ) -> tuple[list[DetachedAgent], QemuCommand, KeptEndpoint | None]:
        """Migrate the VM to ``state`` while it goes on: its agents, its VM and its agent's proxy endpoint.

        Paused in place, it stays paused. The endpoint is :meth:`SessionEgress.carried`'s.

        QEMU migrates a stopped VM only once: the file of the first copy of a session paused in place
        (``frozen.state``) serves every later one until it resumes. Paused to disk, its own file serves.
        ``stream_to``: a running VM's fork, migrated to the URI its new QEMU listens on (no ``state``).
        """
        self.start()
        frozen = self._paused and not self._on_disk
        if not self._paused:
            self._awake()
        with self._quiesced(wait_seconds, purpose):
            transport, spec, run_dir = self._transport, self._vm_command, self._run_dir
            assert transport is not None and spec is not None and run_dir is not None  # noqa: S101 - started
            if stream_to is not None and self._paused:
                # Paused since the fork began (by another thread): its machine is for a file now.
                raise InvalidRequestError(
                    "the session was paused as it was forked; nothing was copied: fork again"
                )
            if self._on_disk:  # it stays on disk: its agents were described when it was let go
                assert state is not None  # noqa: S101 - a paused VM is copied to a file
                _link_or_copy(run_dir / STATE_FILE, state)
                return list(self._detached), spec, self._carried
            users = self._users_without_streams(f"copied ({purpose}); nothing was copied. Close them first")
            agents = [transport.describe(user) for user in users]
            carried = self._egress.carried(transport)
            if stream_to is not None:
                migrate_out(self._monitor(), stream_to, go_on=True)
            elif frozen:
                assert state is not None  # noqa: S101 - a paused VM is copied to a file
                kept = self._frozen_state()
                if not kept.exists():
                    migrate_to_file(self._monitor(), kept, running=False)
                _link_or_copy(kept, state)
            else:
                assert state is not None  # noqa: S101 - a file, or a stream
                migrate_to_file(self._monitor(), state, go_on=True)
        return agents, spec, carried

    def _frozen_state(self) -> Path:
        """The machine's file made by the first copy of this session paused in place (gone at resume)."""
        assert self._run_dir is not None  # noqa: S101 - started
        return self._run_dir / "frozen.state"

    def _new_run_dir(self) -> Path:
        self._run_dir = run_dir = Path(tempfile.mkdtemp(prefix=run_dir_prefix(self._session_id)))
        _LIVE.add(self)
        return run_dir

    def _start_copy(
        self,
        accel: str,
        state: Path | None,
        send: Callable[[str], _Copied],
        guest: GuestFacts | None,
        *,
        keep_state: bool = False,
    ) -> None:
        """Start this new session's QEMU as a copy (reseeded) and serve each of the copy's agents again.

        ``state``: the machine's file; None: it is streamed to the new QEMU (a running VM's fork).
        ``send(uri)`` is called once the QEMU listens on ``uri`` and has the machine sent there (nothing
        to do for a file): what was copied. ``keep_state``: the file is a snapshot's (read, left as it
        is), else this session's (removed).
        """
        with self._lock:
            if self._closed:
                raise SandboxFailedError(self._GONE)
            run_dir = self._run_dir or self._new_run_dir()
            parts = guest_parts(self._config.image)
            self.accel, self.guest = accel, guest
            self._vm_command = spec = _vm_spec(parts, self._config, accel, run_dir)
            self._opener = opener = PortOpener([str(spec.port_socket(n)) for n in range(1, spec.ports + 1)])
            uri = incoming_uri(spec, state)
            copied: list[_Copied] = []

            def sent() -> list[str]:
                copied.append(send(uri))
                opener.port_of = dict(copied[0].port_of)
                return [agent.user for agent in copied[0].agents]

            started = time.monotonic()
            self._vm, self._monitor_connection, streams = start_incoming(
                spec, uri, opener, sent, reseed=True, source=str(state or "the forked session")
            )
            if state is not None and not keep_state:
                state.unlink(missing_ok=True)
            self._transport = transport = AgentTransport(opener)
            self._serve_agents(transport, copied[0].agents, streams, copied[0].carried)
            self.boot_seconds = time.monotonic() - started
            self._watch_idle()

    def _serve_agents(
        self,
        transport: AgentTransport,
        agents: list[DetachedAgent],
        streams: Mapping[str, AgentStream],
        carried: KeptEndpoint | None,
    ) -> None:
        """Serve each of ``agents`` again, and the proxy endpoint one of them holds under this network.

        The endpoint's connections go through this session's network: its policy, or a 403 for each when
        it has none. It is never left listening with nobody to enforce it, and never open.
        """
        for agent in agents:
            listeners = self._egress.adopt(carried) if carried and carried.user == agent.user else None
            transport.reattach(agent, streams[agent.user], time.monotonic() + 30, listeners=listeners)
        if carried is not None and any(agent.user == carried.user for agent in agents):
            self._egress.served_again(transport, carried)

    def _start_from_snapshot(self, snapshot: Snapshot) -> None:
        """Start this new session as a copy of the VM ``snapshot`` kept (refused when it does not fit)."""
        from adk_sandbox.executor.backends.microvm._snapshot import read_machine  # noqa: PLC0415

        parts = guest_parts(self._config.image)
        run_dir = self._new_run_dir()
        record, agents, state = read_machine(
            snapshot, lambda accel: _vm_spec(parts, self._config, accel, run_dir)
        )
        port_of = {agent.user: agent.port for agent in record.agents}
        guest = GuestFacts(record.probe)
        kept = _Copied(agents, record.endpoint, port_of)
        self._start_copy(record.accel, state, lambda _uri: kept, guest, keep_state=True)

    # -- what is enforced ----------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """What the running VM enforces: from its QEMU command line and the in-guest probe."""
        self.start()
        if self._capabilities is None:
            facts, limits = self.guest, self._config.limits
            assert facts is not None  # noqa: S101 - started
            self._capabilities = Capabilities(
                isolation=IsolationClass.MICROVM,
                timeout=True,
                memory=facts.memory_max == str(limits.memory_mb * 1024 * 1024),
                cpu=facts.cpus == self._config.vcpus,
                pids=facts.pids_max == str(limits.pids),
                network=facts.interfaces == ("lo",),  # no NIC on the command line, only lo in the guest
                # The VM's disk is a copy of the image; the only host directory it reaches is the workspace
                # (virtiofsd pivoted into it, in a user namespace of the workspace owner only).
                fs_read=True,
                fs_write=True,
                env=True,
                languages=(Language.COMMAND, *facts.languages),
                channel="agent",
                accel=self.accel,
                # fork(processes=True) copies the whole VM, which QEMU 7.2 cannot with a virtiofs share
                snapshots=("processes", "memory") if self._share is None else (),
            )
        return self._capabilities.model_copy(update={"network_policy": self._egress.policy})

    # -- the network (docs/network.md) ---------------------------------------------------------------
    def set_network(self, network: bool | NetworkPolicy) -> None:
        """Change the VM's network while it runs (docs/network.md, "Changing it at run time").

        ``False``: every live proxied connection is closed and new ones get a 403 (rule ``network off``);
        a :class:`NetworkPolicy`: it replaces the policy, and the open connections it does not allow are
        closed. ``True`` is refused (:class:`PolicyNotEnforceableError`): the VM has no network device.
        Starts the session (a policy needs its agent).
        """
        if network is True:
            raise PolicyNotEnforceableError(
                "a microVM has no network device, so it cannot be given a route out (network=True); give a "
                "NetworkPolicy to reach named hosts through the agent's proxy"
            )
        check_network_argument(network, route=False)
        with self._lock:
            self.start()
            self._egress.switch(network, self._transport, self._config.user)

    # -- commands (the body is ChannelSession.execute) -------------------------------------------------
    def _memory_limit_mb(self) -> int:
        return self._config.limits.memory_mb

    def _working_directory(self) -> tuple[str, str]:
        return self._session_id, self._workdir

    def _explained(self, exc: SandboxFailedError) -> ExecutorError:
        """The agent channel broke: say so when the VM itself stopped."""
        vm = self._vm
        if vm is not None and vm.finished():
            return SandboxFailedError(f"the session's microVM stopped ({exc}). {_stopped(vm, 'QEMU exited')}")
        return exc


class MicroVMBackend(SessionBackend[MicroVMSession]):
    """Creates :class:`MicroVMSession` s: one QEMU microvm per session (docs/MICROVM.md).

    >>> with MicroVMBackend(MicroVMConfig(accel="tcg")) as backend:  # doctest: +SKIP
    ...     with backend.session() as session:
    ...         session.execute(ExecRequest(language="command", code="uname -r", timeout=30)).stdout
    """

    name = "microvm"

    def __init__(
        self, config: MicroVMConfig | None = None, *, pool: int | MicroVMPoolConfig | None = None
    ) -> None:
        """Check QEMU is there and reap what killed owners left; with ``pool``, start booting its members.

        ``pool`` keeps that many VMs (or as a :class:`MicroVMPoolConfig` says) booted for ``session()``
        and ``session(copy_of=...)`` (docs/MICROVM.md, "The pool").
        """
        self.config = config or MicroVMConfig()
        """What every session's VM is made of."""
        if shutil.which(os.environ.get("ADK_SANDBOX_QEMU") or "qemu-system-x86_64") is None:
            raise BackendUnavailableError(
                "QEMU is not installed (qemu-system-x86_64); scripts/setup installs it (Debian: apt install "
                "qemu-system-x86)"
            )
        if shutil.which("setpriv") is None:
            raise BackendUnavailableError("setpriv (util-linux) is needed to tie each VM to its owner")
        self.reaped: list[str] = reap_vms() + reap_copies()
        """Run directories of VMs whose owner process is gone, removed (their processes killed) here, and
        the pool and copies directories such owners left."""
        if self.reaped:
            log.info("removed %d microVM run directories of gone owners", len(self.reaped))
        super().__init__()
        settings = MicroVMPoolConfig(size=pool) if isinstance(pool, int) else pool
        if settings is not None and self.config.idle_pause_seconds is not None:
            raise PolicyNotEnforceableError(
                "idle_pause_seconds pauses a session to disk, which a pool's VMs cannot be (each shares a "
                f"workspace: {NO_MIGRATION}): give one or the other"
            )
        self.pool: MicroVMPool | None = None
        """The booted VMs kept ready (``pool=``), else None."""
        if settings is not None:
            self.pool = MicroVMPool(self.config, settings, self._pool_member)

    def _pool_member(self, share: Share) -> MicroVMSession:
        return MicroVMSession(self.config, share=share)

    def session(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        copy_of: str | os.PathLike[str] | None = None,
        snapshot: Snapshot | str | None = None,
    ) -> MicroVMSession:
        """A new session, ``workspace`` shared at the same path inside; from the pool where it can be.

        ``snapshot=`` (a :meth:`MicroVMSession.snapshot` with processes, or its id or name in the default
        store) starts a copy of the VM it kept; alone, and refused unless this backend makes the same VM.

        With ``workspace``, a VM booted for this session (never from the pool); a workspace owned by root is
        refused (:class:`PolicyNotEnforceableError`). Without it, and with ``pool=``, a pooled VM whose
        workspace is an empty directory of its own (``session.workspace``) at the pool's ``path``, filled with
        a copy of ``copy_of=DIR`` first; removed at close. ``copy_of`` needs a pool
        (:class:`InvalidRequestError`). Depth: docs/MICROVM.md, "The workspace (virtiofs)" and "The pool of
        booted VMs".
        """
        check_one_source(workspace, copy_of, snapshot)
        if snapshot is not None:
            return self._track(self._snapshot_session(snapshot))
        if copy_of is not None:
            if self.pool is None:
                raise InvalidRequestError(
                    "copy_of= fills the workspace of a pooled VM: create the backend with "
                    "MicroVMBackend(pool=...), or share the directory itself with workspace="
                )
            source = str(Path(copy_of).resolve(strict=False))
            if not os.path.isdir(source):
                raise InvalidRequestError(f"copy_of {str(copy_of)!r} is not a directory")
            root = str(self.pool.root)
            if root == source or root.startswith(source.rstrip("/") + "/"):
                raise InvalidRequestError(
                    f"copy_of {source!r} holds the pool's directory ({root}): a copy would take in other "
                    "sessions' workspaces. Give the directory of the project itself"
                )
            return self._track(self.pool.acquire(copy_of=source))
        if workspace is None and self.pool is not None:
            return self._track(self.pool.acquire())
        return self._track(MicroVMSession(self.config, workspace))

    def _snapshot_session(self, given: Snapshot | str) -> MicroVMSession:
        from adk_sandbox.executor.snapshots.model import Snapshot  # noqa: PLC0415
        from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

        snapshot = given if isinstance(given, Snapshot) else SnapshotStore().get(given)
        if not os.path.isdir(snapshot.path):
            raise InvalidRequestError(f"snapshot {snapshot.id} was removed ({snapshot.path} is gone)")
        session = MicroVMSession(self.config)
        try:
            session._start_from_snapshot(snapshot)
        except BaseException:
            session.close()
            raise
        return session

    def close(self) -> None:
        """Close every session of this backend still open (their VMs killed), then the pool's VMs."""
        super().close()
        if self.pool is not None:
            self.pool.close()
