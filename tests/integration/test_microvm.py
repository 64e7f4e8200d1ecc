"""MicroVMBackend here (TCG): the conformance suite, the VM's own kernel, no NIC, deadlines, no leak.

Each test here boots real VMs (about 3 s each under TCG); the module shares one VM for the conformance
checks and one for the checks of the VM itself. A missing QEMU or guest part fails in CI, skips locally.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ResourceLimits
from adk_sandbox.executor.backends.microvm import MicroVMBackend, MicroVMConfig, MicroVMSession
from adk_sandbox.executor.backends.microvm._guest import guest_parts
from adk_sandbox.executor.backends.microvm.backend import _kvm_verdict
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    PolicyNotEnforceableError,
)
from adk_sandbox.executor.types import IsolationClass
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conftest import require

pytestmark = [pytest.mark.slow]

#: 64 MiB: under TCG the memory check's OOM kill takes ~0.6 s at 64 MiB but ~3 s at 128 MiB (guest page faults
#: are emulated), close to the check's 5 s timeout on a loaded machine.
LIMITS = ResourceLimits(memory_mb=64, cpus=1, pids=128, tmpfs_mb=64)
CONFIG = MicroVMConfig(accel="tcg", limits=LIMITS)


def _qemu_processes() -> list[int]:
    """Pids of every QEMU running on this machine, from ``/proc``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip().startswith("qemu-system"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _gone(pid: int, within: float) -> bool:
    until = time.monotonic() + within
    while time.monotonic() < until:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def backend() -> Iterator[MicroVMBackend]:
    require(shutil.which("qemu-system-x86_64") is not None, "QEMU is not installed (scripts/setup)")
    try:
        with MicroVMBackend(CONFIG) as made:
            yield made
    except BackendUnavailableError as exc:
        require(False, f"the microVM backend is not available: {exc}")


@pytest.fixture(scope="module")
def session(backend: MicroVMBackend) -> Iterator[MicroVMSession]:
    try:
        opened = backend.session()
        opened.start()
    except BackendUnavailableError as exc:
        require(False, f"no microVM could be booted: {exc}")
    with opened:
        yield opened


def _leftovers(session: object) -> list[str]:
    """What a closed session left: its QEMU wrapper's process, its run directory."""
    assert isinstance(session, MicroVMSession)
    left = []
    if session.qemu_pid is not None:
        left.append(f"a VM process group {session.qemu_pid}")
    runs = list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"adk-sandbox-vm-{session.session_id}-*"))
    left += [f"run directory {path}" for path in runs]
    return left


class TestMicroVMConformance(ConformanceSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, backend: MicroVMBackend) -> ConformanceTarget:
        return ConformanceTarget(
            backend,
            memory_limit_mb=LIMITS.memory_mb,
            pids_limit=LIMITS.pids,
            leftovers=_leftovers,
            known_differences={
                "memory_limit": KnownDifference(
                    "under TCG the guest's reclaim before its cgroup's OOM kill is emulated and slow: after "
                    "the suite's other checks the agent (in the same cgroup, as in a container) can stall "
                    "past the check's 5 s timeout on a loaded machine; the limit itself is checked by "
                    "test_memory_limit_kills_the_command below with a longer timeout",
                    run=False,
                )
            },
        )


def test_capabilities_say_microvm_and_tcg(session: MicroVMSession) -> None:
    caps = session.capabilities()
    assert caps.isolation is IsolationClass.MICROVM
    assert caps.isolation > IsolationClass.GVISOR
    assert caps.accel == "tcg"
    assert (caps.memory, caps.cpu, caps.pids, caps.network, caps.fs_read, caps.fs_write) == (True,) * 6


def test_memory_limit_kills_the_command(session: MicroVMSession) -> None:
    code = f"dd if=/dev/zero of=/dev/null bs={2 * LIMITS.memory_mb}M count=1 2>/dev/null && echo survived"
    result = session.execute(ExecRequest(language="command", code=code, timeout=60))
    assert result.oom_killed and result.exit_code is None and "survived" not in result.stdout, result
    after = session.execute(ExecRequest(language="command", code="echo alive", timeout=30))
    assert after.stdout == "alive\n", after


def test_guest_runs_its_own_kernel(session: MicroVMSession) -> None:
    result = session.execute(ExecRequest(language="command", code="uname -r", timeout=30))
    guest = result.stdout.strip()
    assert result.exit_code == 0 and guest, result
    assert guest != platform.release(), f"the guest's kernel is the host's ({guest})"
    assert session.guest is not None and session.guest.kernel == guest


def test_guest_has_no_network_device(session: MicroVMSession) -> None:
    result = session.execute(
        ExecRequest(language="command", code="ls /sys/class/net; cat /proc/net/dev", timeout=30)
    )
    assert result.stdout.split()[0] == "lo" and "eth" not in result.stdout and "ens" not in result.stdout, (
        result
    )
    routes = session.execute(ExecRequest(language="command", code="tail -n +2 /proc/net/route", timeout=30))
    assert routes.stdout.strip() == "", routes


def test_root_is_read_only_and_tmp_is_not(session: MicroVMSession) -> None:
    result = session.execute(
        ExecRequest(language="command", code="touch /usr/x 2>&1; touch /tmp/x && echo tmp-ok", timeout=30)
    )
    assert "Read-only file system" in result.stdout and "tmp-ok" in result.stdout, result


def test_workspace_is_refused(backend: MicroVMBackend, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="workspace"):
        backend.session(workspace=tmp_path)


def test_hung_boot_is_killed_at_its_deadline(backend: MicroVMBackend) -> None:
    # No init in the initramfs and no reboot on panic: the guest hangs for ever.
    config = CONFIG.model_copy(
        update={"kernel_args": ("rdinit=/no-such-init", "panic=0"), "boot_timeout_seconds": 6.0}
    )
    before = set(_qemu_processes())
    hung = MicroVMSession(config)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="did not boot within") as raised:
        hung.start()
    elapsed = time.monotonic() - started
    assert elapsed < 6.0 + 5.0, f"the start came back after {elapsed:.1f} s"
    assert "QEMU was killed" in str(raised.value)
    new = set(_qemu_processes()) - before
    assert all(_gone(pid, 0.1) for pid in new), f"the hung VM's QEMU is still running: {new}"
    hung.close()


def test_close_kills_qemu(backend: MicroVMBackend) -> None:
    session = backend.session()
    session.start()
    wrapper = session.qemu_pid
    assert wrapper is not None
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    assert children, "no QEMU under the wrapper"
    session.close()
    assert _gone(wrapper, 5) and all(_gone(int(pid), 5) for pid in children)


_OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from adk_sandbox.executor.backends.microvm import MicroVMConfig, MicroVMSession
    from adk_sandbox.executor.types import ResourceLimits
    session = MicroVMSession(MicroVMConfig(accel="tcg", limits=ResourceLimits(memory_mb=64, cpus=1, pids=64)))
    session.start()
    wrapper = session.qemu_pid
    qemu = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    print(wrapper, *qemu, flush=True)
    time.sleep(600)
    """
)


def test_owner_killed_takes_its_vm_along(backend: MicroVMBackend) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert len(line) >= 2, f"the owner did not start a VM: {line}"
        pids = [int(pid) for pid in line]
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert all(_gone(pid, 5) for pid in pids), f"left running after the owner's SIGKILL: {pids}"
    finally:
        owner.kill()
        owner.wait()


def test_kvm_where_it_does_not_work_is_refused(backend: MicroVMBackend) -> None:
    verdict = _kvm_verdict(guest_parts(CONFIG.image))
    if not verdict:
        pytest.skip("KVM works on this machine: nothing to refuse")
    session = MicroVMSession(CONFIG.model_copy(update={"accel": "kvm"}))
    with pytest.raises(PolicyNotEnforceableError, match="KVM does not work"):
        session.start()
    session.close()
