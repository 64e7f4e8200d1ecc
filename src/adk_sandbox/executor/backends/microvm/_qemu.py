"""One QEMU ``-M microvm`` process: its command line, its start with a lifeline, its kill.

:func:`qemu_command` is the pure command line of a :class:`QemuCommand`; :func:`start_vm` starts it under
a wrapper that kills QEMU when this process dies, even by SIGKILL (:class:`VmProcess`). The guest's console
and QEMU's own messages come back on pipes, of which only a bounded tail is kept (:mod:`._tail`). Depth:
docs/MICROVM.md, "How a VM is made" ("Boot", "No hung VM, no leak", "The console").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from adk_sandbox.executor.backends.microvm._tail import TailReader

__all__ = [
    "GREETING",
    "QemuCommand",
    "Share",
    "VmProcess",
    "host_tsc_khz",
    "kernel_command_line",
    "qemu_command",
    "start_vm",
]

#: What the guest's port loop writes when it waits for a program (guest/vminit.c GREETING).
GREETING = b"\nadk-vm-port-ready-1\n"
#: Guest memory beyond the sandbox's own limit: the kernel, page cache of the root disk, the agents.
GUEST_OVERHEAD_MB = 128
#: The QEMU binary; ``$ADK_SANDBOX_QEMU`` overrides it.
QEMU = "qemu-system-x86_64"

# The wrapper: its stdin is the lifeline. ``$1`` is the number of words of the share's server command that
# come first (0: none), ``$2`` its socket; the rest is QEMU's argv. The server (fsjail, then virtiofsd) starts
# first, under the death signal, and QEMU once the server's socket exists (QEMU connects to it at once). A
# reader waits for the lifeline's EOF (the owner is gone or closed it) and then kills QEMU; the wrapper
# waits for QEMU and exits with it; the server and QEMU die with the wrapper (their death signal). The
# wrapper's stdout is the console's pipe (QEMU's ``-chardev stdio``): the server writes to stderr only.
# (fd 3: dash takes single-digit descriptors only.)
_WRAPPER = (
    'exec 3<&0 0</dev/null; n=$1; s=$2; shift 2; if [ "$n" -gt 0 ]; then '
    '( exec 3<&- 1>&2; i=0; for a in "$@"; do shift; [ $i -lt $n ] && set -- "$@" "$a"; i=$((i + 1)); done; '
    'exec setpriv --pdeathsig KILL -- "$@" ) & f=$!; shift "$n"; '
    'while [ ! -S "$s" ]; do kill -0 $f 2>/dev/null || exit 125; sleep 0.01; done; fi; '
    'setpriv --pdeathsig KILL -- "$@" & q=$!; '
    "( read -r _ <&3; kill -KILL $q 2>/dev/null ) & r=$!; "
    "exec 3<&-; wait $q; s=$?; kill -KILL $r 2>/dev/null; exit $s"
)


@dataclasses.dataclass(frozen=True)
class Share:
    """A host directory shared with the VM over virtiofs, and at which path the guest mounts it.

    virtiofsd serves it from a user namespace whose only ids are ``inner`` (the guest's command user, as the
    guest kernel names it in its requests) mapped to ``outer`` (the host's owner of what the guest creates,
    never root), under a seccomp filter that refuses set-id modes and extended attributes
    (``host/fsjail.c``).
    """

    host_dir: Path
    guest_path: str
    inner: tuple[int, int]
    outer: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class QemuCommand:
    """What one VM is made of (the inputs of :func:`qemu_command`)."""

    kernel: Path
    initramfs: Path
    rootfs: Path
    run_dir: Path
    """Holds the ports' sockets and QEMU's monitor socket (the console is kept in memory, not here)."""
    accel: str
    """``"tcg"`` or ``"kvm"``."""
    memory_mb: int
    """The sandbox's memory (the guest cgroup's limit); the VM gets :data:`GUEST_OVERHEAD_MB` more."""
    vcpus: int
    pids: int
    tmpfs_mb: int
    ports: int
    tsc_khz: int | None
    kernel_args: tuple[str, ...] = ()
    """Appended to the kernel command line (last wins)."""
    aslr: bool = True
    """Randomise the guest processes' address spaces (False: ``norandmaps``)."""
    share: Share | None = None
    """The workspace shared over virtiofs (None: no host directory is reachable from the VM)."""

    def port_socket(self, number: int) -> Path:
        """The host end of virtio-serial port ``number`` (1-based): a Unix socket QEMU listens on."""
        return self.run_dir / f"port{number}.sock"

    @property
    def seed_socket(self) -> Path:
        """The host end of the seed port (after the agents' ports): fresh randomness for a fork only."""
        return self.run_dir / "seed.sock"

    @property
    def fs_socket(self) -> Path:
        """The vhost-user socket between QEMU and virtiofsd (made by fsjail)."""
        return self.run_dir / "fs.sock"

    @property
    def qmp_socket(self) -> Path:
        """QEMU's machine protocol (:mod:`._qmp`): stop, go on, migrate to a file. The host's alone."""
        return self.run_dir / "qmp.sock"


def kernel_command_line(spec: QemuCommand) -> str:
    """The guest kernel's command line: quiet serial console, settings for the guest's init."""
    words = [
        "console=ttyS0",
        "quiet",
        "panic=-1",  # a panic reboots, and -no-reboot turns that into QEMU exiting
        "rdinit=/init",
        f"adk.ports={spec.ports}",
        f"adk.memory={spec.memory_mb}",
        f"adk.pids={spec.pids}",
        f"adk.tmpfs={spec.tmpfs_mb}",
    ]
    if spec.share is not None:
        words.append(f"adk.share={spec.share.guest_path.encode().hex()}")
    if spec.tsc_khz:
        # Without it the early TSC calibration under TCG hangs about one boot in five.
        words.append(f"tsc_early_khz={spec.tsc_khz}")
    if not spec.aslr:
        # Under TCG (QEMU 7.2) translated code is keyed by virtual address: with randomised mappings each
        # process's ld.so and libc are translated again, ~30 ms of a dynamically linked command's ~40.
        words.append("norandmaps")
    return " ".join([*words, *spec.kernel_args])


def qemu_command(spec: QemuCommand, qemu: str | None = None) -> list[str]:
    """The QEMU argv of ``spec``: microvm, no NIC, a read-only root disk, one virtio-serial port per agent."""
    memory = spec.memory_mb + GUEST_OVERHEAD_MB
    machine = "microvm,x-option-roms=off,rtc=on"
    if spec.share is not None:
        machine += ",memory-backend=mem"  # vhost-user needs the guest's memory shared with virtiofsd
    argv = [
        qemu or os.environ.get("ADK_SANDBOX_QEMU") or QEMU,
        "-M", machine,
        "-accel", spec.accel,
        "-cpu", "max",
        "-m", str(memory),
        "-smp", str(spec.vcpus),
        "-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-monitor", "none",
        "-qmp", f"unix:{spec.qmp_socket},server=on,wait=off",
        "-no-reboot",
        "-nic", "none",
        # The guest's serial console (kernel messages, the agents' stderr) on QEMU's stdout, a pipe whose
        # bounded tail the host keeps (_tail.py): never a file the guest could grow without end.
        "-chardev", "stdio,id=console,signal=off",
        "-serial", "chardev:console",
        "-kernel", str(spec.kernel),
        "-initrd", str(spec.initramfs),
        "-append", kernel_command_line(spec),
        "-drive", f"file={spec.rootfs},if=none,id=root,format=raw,readonly=on",
        "-device", "virtio-blk-device,drive=root",
        "-device", f"virtio-serial-device,max_ports={spec.ports + 2}",
    ]  # fmt: skip
    if spec.share is not None:
        argv += [
            "-object", f"memory-backend-memfd,id=mem,size={memory}M,share=on",
            "-global", "virtio-mmio.force-legacy=false",  # vhost-user-fs needs a modern virtio device
            "-chardev", f"socket,id=fs,path={spec.fs_socket}",
            "-device", "vhost-user-fs-device,chardev=fs,tag=workspace",
        ]  # fmt: skip
    for number in range(1, spec.ports + 1):
        argv += [
            "-chardev", f"socket,id=port{number},path={spec.port_socket(number)},server=on,wait=off",
            "-device", f"virtserialport,chardev=port{number},nr={number}",
        ]  # fmt: skip
    argv += [  # the seed port (guest/vminit.c seed_loop): connected only to a fork, before it runs
        "-chardev", f"socket,id=seed,path={spec.seed_socket},server=on,wait=off",
        "-device", f"virtserialport,chardev=seed,nr={spec.ports + 1}",
    ]  # fmt: skip
    return argv


def fs_command(spec: QemuCommand, fsjail: Path, virtiofsd: Path) -> list[str]:
    """The share's server: virtiofsd under fsjail (its user namespace and filter), on the socket's fd 3.

    ``-o sandbox=namespace``: virtiofsd itself pivots into the shared directory (mount, pid and net
    namespaces of its own): nothing outside the directory has a name there. ``cache=none``: the guest
    asks the host for every lookup, attribute and read, so what the host writes is seen at once (as in a
    bind mount). No extended attributes, locks handled in the guest only, the file-descriptor limit left
    as it is (raising it needs a capability the namespace does not have).
    """
    share = spec.share
    if share is None:
        raise ValueError("no share in this VM")
    return [
        str(fsjail), str(share.inner[0]), str(share.inner[1]), str(share.outer[0]), str(share.outer[1]),
        str(spec.fs_socket),
        str(virtiofsd), "--fd=3", "-o", f"source={share.host_dir}", "-o", "sandbox=namespace",
        "-o", "cache=none", "-o", "no_xattr", "-o", "no_posix_lock", "-o", "no_flock",
        "-o", "modcaps=-fsetid:-mknod:-setfcap", "--rlimit-nofile=0",
    ]  # fmt: skip


def host_tsc_khz(cpuinfo: str | None = None) -> int | None:
    """The CPU clock of this machine in kHz (``cpu MHz`` of ``/proc/cpuinfo``), for ``tsc_early_khz``."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "cpu MHz":
            try:
                return int(float(value) * 1000)
            except ValueError:
                return None
    return None


class VmProcess:
    """A started VM: its wrapper's group (QEMU inside), its lifeline, its output's tails, how to kill it."""

    def __init__(
        self,
        wrapper: subprocess.Popen[bytes],
        lifeline: int,
        spec: QemuCommand,
        console: TailReader,
        messages: TailReader,
    ) -> None:
        self._wrapper = wrapper
        self._lifeline: int | None = lifeline
        self.console = console
        """The guest's serial console (its last :data:`._tail.TAIL_BYTES`)."""
        self.messages = messages
        """What QEMU, the wrapper and the share's server wrote to stderr (its last bytes)."""
        self._kill_lock = threading.Lock()  # a pool's close may kill a VM its session is killing too
        self.spec = spec

    @property
    def pid(self) -> int:
        """The wrapper's pid (also the process group's id)."""
        return self._wrapper.pid

    def qemu_alive(self) -> bool:
        """True while QEMU (the wrapper's child) runs."""
        return bool(qemu_pids(self._wrapper.pid))

    def qemu_pid(self) -> int | None:
        """QEMU's own pid (among the wrapper's children: a reader shell, the share's server), or None."""
        for pid in qemu_pids(self._wrapper.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().startswith("qemu"):
                    return pid
            except OSError:
                continue
        return None

    def finished(self) -> bool:
        """True once QEMU has exited (the wrapper exits with it)."""
        return self._wrapper.poll() is not None

    def qemu_log_tail(self, lines: int = 6) -> str:
        """The last lines QEMU itself wrote (its errors)."""
        return "\n".join(self._settled(self.messages).tail.lines(lines))

    def console_tail(self, lines: int = 12) -> str:
        """The last lines of the guest's console, for error messages."""
        return "\n".join(self._settled(self.console).tail.lines(lines))

    def _settled(self, reader: TailReader) -> TailReader:
        """``reader``, with what an exited QEMU wrote before its end read in (waiting up to 1 s for it)."""
        if self.finished():
            reader.wait(1.0)
        return reader

    def kill(self) -> None:
        """Kill the whole group (wrapper and QEMU), reap the wrapper, wait for QEMU to be gone; idempotent."""
        qemu = qemu_pids(self._wrapper.pid)
        with self._kill_lock:  # the lifeline's number is closed once: never a descriptor reused meanwhile
            lifeline, self._lifeline = self._lifeline, None
            if lifeline is not None:
                with contextlib.suppress(OSError):
                    os.close(lifeline)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._wrapper.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._wrapper.wait(timeout=10)
        until = time.monotonic() + 10
        while qemu and time.monotonic() < until:  # reparented to init once the wrapper died: reaped there
            qemu = [pid for pid in qemu if _running(pid)]
            if qemu:
                time.sleep(0.01)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def qemu_pids(wrapper_pid: int) -> list[int]:
    """The pids of the wrapper's descendants (QEMU, virtiofsd and its sandboxed child), from ``/proc``."""
    found: list[int] = []
    parents = [wrapper_pid]
    while parents:
        pid = parents.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
        found += children
        parents += children
    return found


def start_vm(spec: QemuCommand, argv: Sequence[str], server: Sequence[str] = ()) -> VmProcess:
    """Start QEMU as ``argv`` (after the share's ``server``, if any) under the lifeline wrapper; at once."""
    read_end, write_end = os.pipe()  # both close-on-exec; the wrapper gets the read end only
    console_read, console_write = os.pipe()  # the wrapper's stdout: QEMU's -chardev stdio, the console
    messages_read, messages_write = os.pipe()  # the wrapper's stderr: QEMU's and the server's messages
    words = [
        "/bin/sh",
        "-c",
        _WRAPPER,
        "adk-sandbox-vm",
        str(len(server)),
        str(spec.fs_socket),
        *server,
        *argv,
    ]
    try:
        wrapper = subprocess.Popen(
            words,
            stdin=read_end,
            stdout=console_write,
            stderr=messages_write,
            start_new_session=True,  # its own group: killed as one, untouched by a terminal's ^C
            close_fds=True,
        )
    except BaseException:
        for fd in (write_end, console_read, messages_read):
            os.close(fd)
        raise
    finally:
        for fd in (read_end, console_write, messages_write):
            os.close(fd)
    # Read from now on, whatever follows: a pipe nobody reads would stop QEMU once full.
    console = TailReader(console_read, f"adk-vm-console-{wrapper.pid}")
    messages = TailReader(messages_read, f"adk-vm-messages-{wrapper.pid}")
    vm = VmProcess(wrapper, write_end, spec, console, messages)
    # For the reaper (_reaper.py): the group whose virtiofsd to kill when this process is gone.
    (spec.run_dir / "group").write_text(str(wrapper.pid))
    return vm
