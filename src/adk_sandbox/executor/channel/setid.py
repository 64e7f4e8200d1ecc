"""The set-id rule as a seccomp filter each command installs on itself (classic BPF, generated here).

Why a second copy of the rule of the sandbox's seccomp profile (the Docker backend's ``seccomp/`` profile,
``executor/backends/docker/_seccomp.py``): gVisor's runsc (even with --oci-seccomp) applies the container's
profile to the container's first process only, not to processes started by ``docker exec`` — which is how
every command starts. So what starts a command in the sandbox (the agent, for its shims and a file
operation's workers) installs this filter before exec'ing it (no_new_privs is set, so nothing the command
does can remove it). Under runc it stacks on the profile. The agent gets it as a generated C header
(:mod:`.static_agent`).
"""

from __future__ import annotations

import os
import struct

__all__ = ["CREATING_FLAGS", "ENOSYS", "SETID_BITS", "native_arch", "setid_filter"]

#: S_ISUID | S_ISGID.
SETID_BITS = 0o6000
#: O_CREAT | __O_TMPFILE (x86-64 and arm64 values): an open with neither creates nothing.
CREATING_FLAGS = 0o100 | 0o20000000
ENOSYS = 38


_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_AARCH64 = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1

# BPF opcodes (linux/filter.h): load word absolute, jumps on constant, return constant.
_LD_ABS_W = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06

#: arch -> syscall -> (index of its flags argument or None, index of its mode argument).
_MODE_SYSCALLS: dict[int, dict[int, tuple[int | None, int]]] = {
    _AUDIT_ARCH_X86_64: {
        2: (1, 2),  # open
        85: (None, 1),  # creat
        90: (None, 1),  # chmod
        91: (None, 1),  # fchmod
        133: (None, 1),  # mknod
        257: (2, 3),  # openat
        259: (None, 2),  # mknodat
        268: (None, 2),  # fchmodat
        452: (None, 2),  # fchmodat2
    },
    _AUDIT_ARCH_AARCH64: {
        33: (None, 2),  # mknodat
        52: (None, 1),  # fchmod
        53: (None, 2),  # fchmodat
        56: (2, 3),  # openat
        452: (None, 2),  # fchmodat2
    },
}
_OPENAT2 = 437
_IO_URING = (425, 426, 427)


def _argument_low_word(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * index


def setid_filter(arch: int = _AUDIT_ARCH_X86_64) -> bytes:
    """A classic-BPF seccomp program refusing set-id modes (``struct sock_filter`` array, native order).

    Same rule as the profile: the chmod family and the creating calls fail with EPERM when the mode has
    S_ISUID or S_ISGID (an open without O_CREAT/O_TMPFILE passes whatever its mode), ``openat2`` fails
    with ENOSYS and ``io_uring_*`` with EPERM. Any other architecture (i386 or x32 calls on x86-64)
    is refused outright, so a 32-bit entry point cannot go around the rule. Pure: unit-tested by
    installing it in a child process on the host.
    """
    syscalls = _MODE_SYSCALLS[arch]
    # Jump targets are labels (str) or relative offsets (int), resolved once every label is placed.
    program: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def emit(code: int, k: int, true: int | str = 0, false: int | str = 0) -> None:
        program.append((code, true, false, k))

    emit(_LD_ABS_W, 4)  # arch
    emit(_JEQ, arch, 0, "deny")
    emit(_LD_ABS_W, 0)  # syscall number
    if arch == _AUDIT_ARCH_X86_64:
        emit(_JGE, _X32_SYSCALL_BIT, "deny", 0)
    emit(_JEQ, _OPENAT2, "enosys", 0)
    for number in _IO_URING:
        emit(_JEQ, number, "deny", 0)
    for number in syscalls:
        emit(_JEQ, number, f"check-{number}", 0)
    emit(_RET, _RET_ALLOW)
    for number, (flags_index, mode_index) in syscalls.items():
        labels[f"check-{number}"] = len(program)
        if flags_index is not None:
            emit(_LD_ABS_W, _argument_low_word(flags_index))
            emit(_JSET, CREATING_FLAGS, 0, "allow")
        emit(_LD_ABS_W, _argument_low_word(mode_index))
        emit(_JSET, SETID_BITS, "deny", "allow")
    for label, action in (
        ("allow", _RET_ALLOW),
        ("deny", _RET_ERRNO | _EPERM),
        ("enosys", _RET_ERRNO | ENOSYS),
    ):
        labels[label] = len(program)
        emit(_RET, action)

    def offset(index: int, target: int | str) -> int:
        # Offsets count from the next instruction and must fit in a byte (struct.pack checks).
        return labels[target] - index - 1 if isinstance(target, str) else target

    resolved = [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(program)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in resolved)


def native_arch() -> int:
    """The AUDIT_ARCH value of this machine (the container's architecture is the host's)."""
    machine = os.uname().machine
    if machine in ("x86_64", "amd64"):
        return _AUDIT_ARCH_X86_64
    if machine in ("aarch64", "arm64"):
        return _AUDIT_ARCH_AARCH64
    raise OSError(f"no set-id seccomp filter for the architecture {machine}")
