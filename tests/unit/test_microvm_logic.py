"""Pure logic of the microVM backend: QEMU and kernel command lines, the port header, the config."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from adk_sandbox.executor.backends.microvm._pause import SEED_GREETING, _reseed
from adk_sandbox.executor.backends.microvm._port import program_header
from adk_sandbox.executor.backends.microvm._qemu import (
    GUEST_OVERHEAD_MB,
    QemuCommand,
    Share,
    fs_command,
    host_tsc_khz,
    kernel_command_line,
    qemu_command,
)
from adk_sandbox.executor.backends.microvm._reaper import reap_vms, run_dir_prefix
from adk_sandbox.executor.backends.microvm._share import plan_share
from adk_sandbox.executor.backends.microvm.backend import GuestFacts, guest_aslr
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig, MicroVMPoolConfig
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor.types import Language, ResourceLimits


def _spec(**changes: object) -> QemuCommand:
    fields: dict[str, object] = dict(
        kernel=Path("/k/vmlinux"), initramfs=Path("/k/initramfs.gz"), rootfs=Path("/r/root.ext4"),
        run_dir=Path("/run/vm"), accel="tcg", memory_mb=256, vcpus=2, pids=100, tmpfs_mb=64, ports=3,
        tsc_khz=2596128,
    )  # fmt: skip
    fields.update(changes)
    return QemuCommand(**fields)  # type: ignore[arg-type]


def _value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_command_line_is_a_microvm_without_nic() -> None:
    argv = qemu_command(_spec(), qemu="qemu")
    assert _value(argv, "-M")[0].startswith("microvm")
    assert _value(argv, "-nic") == ["none"] and "-nodefaults" in argv
    assert not any("net" in word for word in _value(argv, "-device"))
    assert _value(argv, "-accel") == ["tcg"]
    assert _value(argv, "-m") == [str(256 + GUEST_OVERHEAD_MB)] and _value(argv, "-smp") == ["2"]
    assert "-no-reboot" in argv


def test_root_disk_is_read_only_and_ports_are_sockets() -> None:
    argv = qemu_command(_spec(), qemu="qemu")
    assert _value(argv, "-drive") == ["file=/r/root.ext4,if=none,id=root,format=raw,readonly=on"]
    sockets = [word for word in _value(argv, "-chardev") if word.startswith("socket,")]
    assert sockets == [
        *(f"socket,id=port{n},path=/run/vm/port{n}.sock,server=on,wait=off" for n in (1, 2, 3)),
        "socket,id=seed,path=/run/vm/seed.sock,server=on,wait=off",  # after the agents' ports
    ]
    assert "virtio-serial-device,max_ports=5" in _value(argv, "-device")
    assert "virtserialport,chardev=seed,nr=4" in _value(argv, "-device")


def _guest_seed_loop(guest: socket.socket, answer: bytes, seen: list[bytes]) -> None:
    """What guest/vminit.c's seed loop does, answering ``answer``; the seed it got goes to ``seen``."""
    guest.sendall(SEED_GREETING)
    seed = b""
    while len(seed) < 32:
        seed += guest.recv(32 - len(seed))
    seen.append(seed)
    guest.sendall(answer)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"reseeded\n", None),
        (b"failed 1\n", "could not take fresh randomness"),
        (b"x" * 5000, "without the answer"),
    ],
)
def test_a_fork_is_reseeded_or_refused(answer: bytes, error: str | None) -> None:
    """The host's side of the seed port: fresh bytes each time; an answer other than "reseeded", or a flood
    without one, fails the fork (it is not handed out)."""
    seen: list[bytes] = []
    for _ in range(2):
        host, guest = socket.socketpair()
        with host, guest:
            loop = threading.Thread(target=_guest_seed_loop, args=(guest, answer, seen))
            loop.start()
            if error is None:
                _reseed(host, time.monotonic() + 5)
            else:
                with pytest.raises(SandboxFailedError, match=error):
                    _reseed(host, time.monotonic() + 5)
            loop.join()
    assert len(seen) == 2 and seen[0] != seen[1]


def test_kernel_command_line_carries_the_limits_and_the_tsc() -> None:
    line = kernel_command_line(_spec(kernel_args=("panic=0",)))
    words = line.split()
    assert {"adk.ports=3", "adk.memory=256", "adk.pids=100", "adk.tmpfs=64", "tsc_early_khz=2596128"} <= set(
        words
    )
    assert words[-1] == "panic=0"  # given words come last: they win
    assert "tsc_early_khz" not in kernel_command_line(_spec(tsc_khz=None))
    assert "norandmaps" not in words
    assert "norandmaps" in kernel_command_line(_spec(aslr=False)).split()


def test_host_tsc_khz_from_cpuinfo() -> None:
    assert host_tsc_khz("processor\t: 0\ncpu MHz\t\t: 2596.128\n") == 2596128
    assert host_tsc_khz("processor\t: 0\n") is None


def test_program_header() -> None:
    header = program_header(["/bin/sh", "-c", "echo é\n"], "1000:1001")
    assert header == b"ADKVM1 1000 1001 3\n7\n/bin/sh2\n-c8\necho \xc3\xa9\n"
    assert program_header(["x"], "5").startswith(b"ADKVM1 5 5 1\n")
    with pytest.raises(ValueError, match="numeric"):
        program_header(["x"], "root")


def test_config_validation() -> None:
    assert MicroVMConfig(user="7").user == "7:7"
    assert MicroVMConfig(limits=ResourceLimits(cpus=3)).vcpus == 3
    with pytest.raises(ValidationError, match="whole vCPUs"):
        MicroVMConfig(limits=ResourceLimits(cpus=1.5))
    with pytest.raises(ValidationError):
        MicroVMConfig(user="root")
    with pytest.raises(ValidationError, match="single words"):
        MicroVMConfig(kernel_args=("a b",))
    with pytest.raises(ValidationError):
        MicroVMConfig.model_validate({"accel": "hvf"})


def test_guest_facts() -> None:
    facts = GuestFacts(
        "kernel=6.1.0-57-cloud-amd64\nnet=lo \nmemory=134217728\npids=128\ncpus=1\nlanguage=python3\n"
    )
    assert facts.kernel == "6.1.0-57-cloud-amd64" and facts.interfaces == ("lo",)
    assert (facts.memory_max, facts.pids_max, facts.cpus) == ("134217728", "128", 1)
    assert facts.languages == (Language.PYTHON,)
    assert not facts.aslr and GuestFacts("aslr=2\n").aslr and not GuestFacts("aslr=0\n").aslr


def test_guest_aslr_follows_the_accelerator() -> None:
    """Off only under TCG by default (the translation cost), on under KVM, as asked otherwise."""
    assert guest_aslr(MicroVMConfig(), "kvm") and not guest_aslr(MicroVMConfig(), "tcg")
    assert guest_aslr(MicroVMConfig(guest_aslr="on"), "tcg")
    assert not guest_aslr(MicroVMConfig(guest_aslr="off"), "kvm")


def _share(tmp: Path) -> Share:
    return Share(host_dir=tmp, guest_path="/w s/é", inner=(1000, 1000), outer=(1001, 1002))


def test_command_line_with_a_share(tmp_path: Path) -> None:
    spec = _spec(share=_share(tmp_path))
    argv = qemu_command(spec, qemu="qemu")
    assert _value(argv, "-M")[0].endswith(",memory-backend=mem")
    assert f"memory-backend-memfd,id=mem,size={256 + GUEST_OVERHEAD_MB}M,share=on" in _value(argv, "-object")
    assert "vhost-user-fs-device,chardev=fs,tag=workspace" in _value(argv, "-device")
    assert _value(argv, "-global") == ["virtio-mmio.force-legacy=false"]
    assert f"adk.share={'/w s/é'.encode().hex()}" in kernel_command_line(spec).split()
    plain = qemu_command(_spec(), qemu="qemu")
    assert "-object" not in plain and "vhost-user-fs-device" not in " ".join(plain)
    server = fs_command(spec, Path("/j/fsjail"), Path("/q/virtiofsd"))
    assert server[:6] == ["/j/fsjail", "1000", "1000", "1001", "1002", str(spec.fs_socket)]
    assert f"source={tmp_path}" in server and "sandbox=namespace" in server and "no_xattr" in server


def test_plan_share_refusals(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(tmp_path, 1000, 1000)
        share = plan_share(tmp_path, "1000:1000", euid=0)
        assert (share.inner, share.outer, share.guest_path) == ((1000, 1000), (1000, 1000), str(tmp_path))
        os.chown(tmp_path, 0, 0)
        with pytest.raises(PolicyNotEnforceableError, match="owned by root"):
            plan_share(tmp_path, "1000:1000", euid=0)
    with pytest.raises(PolicyNotEnforceableError, match="not by this process's user"):
        plan_share(tmp_path, "1000:1000", euid=4242)
    for reserved in ("/", "/tmp", "/home", "/proc/x", "/run/y", "/dev"):
        with pytest.raises(InvalidRequestError):
            plan_share(reserved, "1000:1000")
    with pytest.raises(InvalidRequestError, match="does not exist"):
        plan_share(tmp_path / "missing", "1000:1000")
    with pytest.raises(InvalidRequestError, match="at most"):
        plan_share("/" + "x" * 500, "1000:1000")


def test_run_dir_names_their_owner_for_the_reaper(tmp_path: Path) -> None:
    mine = tmp_path / (run_dir_prefix("0123456789ab") + "xyz")
    mine.mkdir()
    gone = run_dir_prefix("ba9876543210").replace(f"-{os.getpid()}-", "-999999999-")
    (tmp_path / (gone + "abc")).mkdir()
    (tmp_path / "adk-sandbox-vm-unrelated").mkdir()
    assert reap_vms(str(tmp_path)) == [str(tmp_path / (gone + "abc"))]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, "adk-sandbox-vm-unrelated"])


def test_pool_config_validation() -> None:
    assert MicroVMPoolConfig(size=2).path == "/workspace"
    for bad in ("workspace", "/a/../b", "/", "/tmp", "/proc/w", "/home"):
        with pytest.raises(ValidationError):
            MicroVMPoolConfig(size=1, path=bad)
    with pytest.raises(ValidationError):
        MicroVMPoolConfig(size=0)


def test_plan_share_at_another_guest_path(tmp_path: Path) -> None:
    """A pooled VM's directory is mounted at the pool's path, not at the host's (checked as the guest's)."""
    if os.geteuid() == 0:
        os.chown(tmp_path, 1000, 1000)
    share = plan_share(tmp_path, "1000:1000", guest_path="/workspace")
    assert (share.host_dir, share.guest_path) == (tmp_path, "/workspace")
    with pytest.raises(InvalidRequestError, match="hide"):
        plan_share(tmp_path, "1000:1000", guest_path="/home")


def test_network_takes_false_or_a_policy_and_refuses_a_route() -> None:
    from adk_sandbox.executor.network.policy import NetworkPolicy  # noqa: PLC0415

    assert MicroVMConfig().network is False
    policy = MicroVMConfig(network={"allow": ["pypi.org"]}).network
    assert isinstance(policy, NetworkPolicy) and policy.allow == ("pypi.org",)
    with pytest.raises(ValidationError, match="a microVM has none"):
        MicroVMConfig(network=True)
