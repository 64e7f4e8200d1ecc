"""The host keeps a bounded tail of a microVM's console (and of QEMU's messages), never an unbounded file.

A command running as uid 0 in the guest can write to the serial console without end; it used to go to
``console.log`` in the run directory (the host's temporary directory, often a tmpfs). The tail logic is
tested here alone, and through :func:`start_vm` with a stand-in for QEMU that floods its stdout (where
``-chardev stdio`` puts the console) and stderr. The real guest is in tests/integration/test_microvm.py.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.microvm._qemu import QemuCommand, qemu_command, start_vm
from adk_sandbox.executor.backends.microvm._tail import TAIL_BYTES, BoundedTail, TailReader


def _spec(run_dir: Path) -> QemuCommand:
    return QemuCommand(
        kernel=Path("/k/vmlinux"), initramfs=Path("/k/initramfs.gz"), rootfs=Path("/r/root.ext4"),
        run_dir=run_dir, accel="tcg", memory_mb=256, vcpus=1, pids=100, tmpfs_mb=64, ports=1, tsc_khz=None,
    )  # fmt: skip


def _value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


# -- the tail alone ---------------------------------------------------------------------------------------
def test_tail_keeps_the_last_bytes_and_counts_all() -> None:
    tail = BoundedTail(10)
    tail.feed(b"0123456")
    assert tail.data() == b"0123456" and tail.seen == 7
    tail.feed(b"789abc")
    assert tail.data() == b"3456789abc" and tail.seen == 13
    tail.feed(b"x" * 25)  # one write beyond the limit
    assert tail.data() == b"x" * 10 and tail.seen == 38


def test_tail_never_holds_more_than_its_limit() -> None:
    tail = BoundedTail(1000)
    for size in (1, 7, 999, 1000, 1001, 5000, 3):
        tail.feed(b"y" * size)
        assert len(tail.data()) <= 1000
    assert tail.seen == 1 + 7 + 999 + 1000 + 1001 + 5000 + 3


def test_tail_lines_are_the_last_non_blank_ones_without_a_cut_line() -> None:
    tail = BoundedTail(40)
    tail.feed(b"first line that will be cut\r\n\r\nsecond\r\n   \r\nthird\r\nfourth")
    # "...be cut" lost its start to the limit: left out rather than quoted half.
    assert tail.lines(12) == ["second", "third", "fourth"]
    assert tail.lines(2) == ["third", "fourth"]
    assert tail.lines(0) == []


def test_tail_of_one_long_line_is_kept_and_bad_bytes_are_replaced() -> None:
    tail = BoundedTail(8)
    tail.feed(b"z" * 20 + b"\xff\xfe")
    assert tail.lines(3) == ["zzzzzz\ufffd\ufffd"]  # no newline at all: the cut line is all there is


def test_tail_refuses_a_limit_of_nothing() -> None:
    with pytest.raises(ValueError):
        BoundedTail(0)


def test_reader_drains_a_flood_to_its_end_keeping_only_the_limit() -> None:
    read_end, write_end = os.pipe()
    reader = TailReader(read_end, "test-tail", limit=4096)
    block = b"".join(b"line %06d\n" % n for n in range(100_000))  # ~1.1 MB, far beyond the pipe's buffer
    with os.fdopen(write_end, "wb") as writer:
        writer.write(block)
        writer.write(b"the very last line\n")
    assert reader.wait(10), "the reader did not see the pipe's end"
    assert reader.tail.seen == len(block) + 19
    assert len(reader.tail.data()) == 4096
    assert reader.tail.lines(2) == ["line 099999", "the very last line"]
    with pytest.raises(OSError):
        os.fstat(read_end)  # the reader closed its end


# -- through start_vm, with a stand-in for QEMU -------------------------------------------------------------
def test_qemu_writes_the_console_to_its_stdout_not_to_a_file(tmp_path: Path) -> None:
    argv = qemu_command(_spec(tmp_path), qemu="qemu")
    consoles = [word for word in _value(argv, "-chardev") if "id=console" in word]
    assert consoles == ["stdio,id=console,signal=off"]
    assert _value(argv, "-serial") == ["chardev:console"]
    assert not any(word.startswith("file,") for word in _value(argv, "-chardev"))


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="the wrapper needs setpriv (util-linux)")
def test_a_flooding_vm_leaves_no_file_and_a_bounded_tail(tmp_path: Path) -> None:
    """Stand-in QEMU: ~9 MB on stdout (the console) and ~7.5 MB on stderr, then the last lines of each."""
    flood = (
        "yes console-spam-line | head -n 500000; echo 'console: the last words'; "
        "yes qemu-spam-line | head -n 500000 >&2; echo 'qemu: the last error' >&2"
    )
    vm = start_vm(_spec(tmp_path), ["/bin/sh", "-c", flood])
    try:
        until = time.monotonic() + 60
        while not vm.finished() and time.monotonic() < until:
            time.sleep(0.05)
        assert vm.finished(), "the stand-in did not finish: was it left blocked on a full pipe?"
        assert vm.console_tail(2) == "console-spam-line\nconsole: the last words"
        assert vm.qemu_log_tail(1) == "qemu: the last error"
        assert vm.console.tail.seen > 7 << 20 and vm.messages.tail.seen > 7 << 20
        assert len(vm.console.tail.data()) == TAIL_BYTES == len(vm.messages.tail.data())
        on_disk = {path.name: path.stat().st_size for path in tmp_path.iterdir()}
        assert set(on_disk) == {"group"} and on_disk["group"] < 32, on_disk
    finally:
        vm.kill()
    assert vm.console.wait(5) and vm.messages.wait(5), "the readers did not end with the VM"
