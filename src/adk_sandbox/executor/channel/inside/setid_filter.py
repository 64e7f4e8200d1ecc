# Installs the set-id seccomp filter (executor/channel/setid.py) on the calling process, with no_new_privs:
# spliced into every in-sandbox program's prelude by executor/channel/programs.py, followed by
# "SETID = bytes.fromhex(...)" (None on an architecture without a filter).
# @CHECK-ONLY@
# For the checkers only (not shipped): the program the host appends after this function.
SETID: bytes | None = None
# @END-CHECK-ONLY@


def install_setid_filter(program: "bytes") -> "None":
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2).
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the set-id seccomp filter")
