# adk-sandbox agent, protocol 1 (executor/channel/inside/agent.py)
import errno
import json
import os
import select
import signal
import struct
import sys
import time

# @CHECK-ONLY@
# For the checkers only (not shipped, see executor/channel/programs.py): what the prelude defines.
from typing import Any

from adk_sandbox.executor.channel.inside.prelude import (
    Procs,
    argv_of,
    below,
    kill_all,
    marker_of,
    parse_protected,
    reap_any,
    scan,
    send,
    start_of,
)
from adk_sandbox.executor.channel.inside.setid_filter import SETID, install_setid_filter

# @END-CHECK-ONLY@
# @PRELUDE@
HDR = struct.Struct(">BBHII")
HELLO, RUN, STDIN, STDOUT, STDERR, EXIT, KILL, PING, PONG, ERROR, FILE, RESULT = range(1, 13)
LISTEN, OPEN, DATA, CREDIT, CLOSE, DIAL = range(13, 19)  # the proxy endpoint's connections, and dialing
CONN_BASE = 0x80000000  # frames.CONNECTION_BASE: the agent allocates connection channels from here
DIAL_BASE = 0xC0000000  # frames.DIAL_BASE: ... up to here; the host's DIAL channels are above
MAX_LISTENERS = 64  # frames.MAX_LISTENERS
WINDOW = 256 * 1024  # frames.WINDOW: each direction's initial window
MAX_CONNS = 256  # frames.MAX_CONNECTIONS
LINGER = 30.0  # frames.CLOSE_LINGER_SECONDS
OPS = ["read", "write", "stat", "list", "mkdir", "remove", "rename"]
MAXP = 4 << 20  # frames.MAX_PAYLOAD
SELF = os.getpid()
MARK = b"ADK_SANDBOX_EXEC="
MAX_GROUPS = 16  # executor.types.MAX_BACKGROUND_GROUPS
LIBC: "ctypes.CDLL | None"
try:
    import ctypes

    LIBC = ctypes.CDLL(None, use_errno=True)
except Exception:
    LIBC = None


def prctl(op: "int", arg: "int") -> "bool":
    try:
        return LIBC is not None and LIBC.prctl(op, arg, 0, 0, 0) == 0
    except Exception:
        return False


def has_children() -> "bool":
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def fork_with_room() -> "int":
    # A full pids limit (a fork bomb next door) may free up: try for about a second before giving up.
    for attempt in range(20):
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(0.05)
    raise OSError(errno.EAGAIN, "no room for a process (pids limit)")


def close_all(fds: "list[int]") -> "None":
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def nonblock(fd: "int") -> "None":
    os.set_blocking(fd, False)


DEFAULT_SIGNALS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP, signal.SIGPIPE)


def resolve(name: "str", env: "dict[str, str]") -> "str":
    if "/" in name:
        return name
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise OSError(errno.ENOENT, "No such file or directory")


def set_oom_score_adj() -> "None":
    # 500: the OOM killer takes the command before the agent. Non-dumpable (inherited from the agent),
    # /proc/self/* belongs to root, so a shim of any other uid gets EACCES writing it: the shim becomes
    # dumpable for this one write, then non-dumpable again before it starts anything. What that window
    # exposes to a same-uid process racing for it is not what non-dumpable guards on the agent: the shim
    # has already closed every descriptor but the command's own pipes and its status pipe (no channel of
    # the agent), and a shim that process took over (ptrace) still dies with the command's tree, which
    # the agent kills. A copy of the agent's memory at the fork is readable in that window; it holds
    # data of this same user's commands and files only (each user has an agent of its own).
    prctl(4, 1)  # PR_SET_DUMPABLE
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass
    finally:
        prctl(4, 0)


def start_command(argv: "list[str]", env: "dict[str, str]", cwd: "str", status_w: "int") -> "int":
    # In the shim: what the command inherits (oom_score_adj, cwd, the set-id filter with no_new_privs) is
    # set on the shim itself, then the command is spawned into its own session with its exact env.
    try:
        set_oom_score_adj()
        os.chdir(cwd)
        if not SETID_STATE[0]:
            raise OSError(95, "no set-id seccomp filter for this architecture")
        # The filter (with no_new_privs) was installed on the agent itself at start, so this shim and
        # the command inherit it: the command can never lift it. Started with the opt-in word instead,
        # the agent has no filter and neither has anything it starts (SETID_STATE, main()).
        if hasattr(os, "posix_spawn"):
            return os.posix_spawn(resolve(argv[0], env), argv, env, setsid=True, setsigdef=DEFAULT_SIGNALS)
        child = os.fork()
        if child == 0:
            try:
                for s in DEFAULT_SIGNALS:
                    signal.signal(s, signal.SIG_DFL)
                os.setsid()
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        return child
    except OSError as e:
        os.write(2, ("%s: %s\n" % (argv[0], e.strerror)).encode())
        os.write(status_w, ("E %d\n" % (127 if e.errno == errno.ENOENT else 126)).encode())
        os._exit(0)


# -- the shim: one per command, a forked copy of the agent -------------------------------------------
def shim(spec: "dict[str, Any]", fds: "tuple[int, int, int]", status_w: "int") -> "None":
    global SELF
    SELF = os.getpid()
    try:
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the command's orphans come back here
        for s in range(1, signal.NSIG):
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass
        for s in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(s, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        keep = set([0, 1, 2, status_w])
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        argv: "list[str]" = spec["argv"]
        env: "dict[str, str]" = spec["env"]
        cwd: "str" = spec["cwd"]
    except BaseException as e:
        try:
            os.write(2, ("adk-sandbox: cannot start the command: %s\n" % e).encode())
        finally:
            os._exit(126)
    child = start_command(argv, env, cwd, status_w)
    for fd in (0, 1, 2):
        os.close(fd)
    status: "int | None" = None
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = st
            break
    if spec.get("background"):
        keep_group(status, status_w)
    # No child left means no descendant left: every orphan of the command is re-parented to this shim.
    while has_children():
        kill_all(lambda procs: below([SELF], procs))
        try:
            while os.waitpid(-1, 0):
                pass
        except ChildProcessError:
            break
        except InterruptedError:
            pass
    report(status, status_w)
    os._exit(0)


def report(status: "int | None", status_w: "int") -> "None":
    if status is not None:
        if os.WIFSIGNALED(status):
            msg = "S %d\n" % os.WTERMSIG(status)
        else:
            msg = "E %d\n" % os.WEXITSTATUS(status)
        os.write(status_w, msg.encode())


def keep_group(status: "int | None", status_w: "int") -> "None":
    # A background command: its status goes out now, and the shim stays as the keeper of what the
    # command left, reaping (orphans still come back here) until nothing is left; the agent kills the
    # whole group when the session ends.
    report(status, status_w)
    os.close(status_w)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            pass
    os._exit(0)


# -- memory cgroup OOM-kill counter, read inside the container ----------------------------------------
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")  # v1, v2


def oom_kills() -> "int | None":
    for path in OOM_FILES:
        try:
            with open(path, "rb") as f:
                for line in f:
                    key, _, value = line.partition(b" ")
                    if key == b"oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
    return None


# -- file operations: each in a forked worker, so nothing it waits for holds the agent's loop ----------
def write_all(fd: "int", data: "bytes | bytearray") -> "None":
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            pass


def read_exact(fd: "int", n: "int") -> "bytes | None":
    out = bytearray()
    while len(out) < n:
        try:
            part = os.read(fd, n - len(out))
        except InterruptedError:
            continue
        if not part:
            return None
        out += part
    return bytes(out)


def copy_in(src: "int", dst: "int") -> "int":
    # The agent frames the write's data as (u32 length, bytes) chunks ending with a 0 length: a pipe that
    # ends without that end mark (the agent died, the host gave up) is an abandoned write, never a short one.
    size = 0
    while True:
        head = read_exact(src, 4)
        if head is None:
            raise OSError(errno.ECANCELED, "the data of this write did not arrive in full")
        n: "int" = struct.unpack(">I", head)[0]
        if n == 0:
            return size
        chunk = read_exact(src, n)
        if chunk is None:
            raise OSError(errno.ECANCELED, "the data of this write did not arrive in full")
        write_all(dst, chunk)
        size += n


def want_int(req: "dict[str, Any]", key: "str", default: "int | None" = None) -> "int":
    value = req.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("%s must be an integer >= 0" % key)
    return value


def want_mode(req: "dict[str, Any]", default: "int") -> "int":
    mode = want_int(req, "mode", default)
    if mode > 0o7777:
        raise ValueError("mode %o is out of range" % mode)
    if mode & ~0o777:
        raise OSError(errno.EPERM, "set-id and sticky bits are not allowed")
    return mode


def want_path(value: "object") -> "bytes":
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise ValueError("a path must be an absolute string without NUL")
    return os.fsencode(value)


def kind_of(mode: "int") -> "str":
    import stat as S

    if S.S_ISREG(mode):
        return "file"
    if S.S_ISDIR(mode):
        return "dir"
    return "symlink" if S.S_ISLNK(mode) else "other"


def open_regular(path: "bytes", flags: "int", mode: "int" = 0) -> "tuple[int, os.stat_result]":
    # O_NONBLOCK: opening a FIFO (or a device) must not wait for a peer; only regular files are used.
    import stat as S

    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, mode)
    st = os.fstat(fd)
    if not S.S_ISREG(st.st_mode):
        os.close(fd)
        if S.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, "Is a directory")
        raise OSError(errno.EINVAL, "not a regular file")
    return fd, st


def make_dirs(path: "bytes", mode: "int") -> "None":
    todo = [path]
    while todo:
        p = todo[-1]
        try:
            os.mkdir(p, mode)
        except FileNotFoundError:
            parent = os.path.dirname(p)
            if parent == p:
                raise
            todo.append(parent)
            continue
        except FileExistsError:
            if not os.path.isdir(p):
                raise
        todo.pop()


REFUSED = "Permission denied: the command user may not write this file; it was left unchanged"


def existing_target(path: "bytes") -> "os.stat_result | None":
    # What a write that replaces its path finds there (as agent.c's existing_target): the stat of a regular
    # file the command user may write, None for nothing to keep (no entry, a symlink, a FIFO, socket or
    # device: replaced as a new file), OSError when refused. Opening it O_WRONLY (no O_TRUNC: nothing
    # changes) is the kernel's own answer for this user; O_NOFOLLOW: a symlink is replaced, never
    # followed nor asked; O_NONBLOCK: a FIFO never holds the worker. A running program cannot be opened
    # for writing (ETXTBSY) yet may be replaced: access(W_OK) decides. The rename later replaces the
    # directory entry only, so whatever the command swaps in meanwhile is replaced, never written through.
    import stat as S

    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise OSError(e.errno, REFUSED)
        if e.errno != errno.ETXTBSY:
            raise
        st = os.lstat(path)
        if not S.S_ISREG(st.st_mode):
            return None
        if not os.access(path, os.W_OK):
            raise OSError(errno.EACCES, REFUSED)
        return st
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st if S.S_ISREG(st.st_mode) else None


def keep_owner_and_mode(fd: "int", old: "os.stat_result") -> "None":
    # As far as the command user may give it (no CAP_CHOWN: its own uid, a group it is in), then the
    # permission bits (after fchown, which clears set-id bits; never set-id bits).
    now = os.fstat(fd)
    if (now.st_uid, now.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except OSError:
            try:
                os.fchown(fd, -1, old.st_gid)
            except OSError:
                pass
    os.fchmod(fd, old.st_mode & 0o777)


def file_op(req: "dict[str, Any]", out: "int", data_in: "Any", tmp: "Any") -> "dict[str, Any]":
    op, path = req["op"], want_path(req["path"])
    if op == "read":
        offset, limit = want_int(req, "offset", 0), want_int(req, "limit")
        fd, st = open_regular(path, os.O_RDONLY)
        try:
            while limit > 0:
                chunk = os.pread(fd, min(limit, 65536), offset)
                if not chunk:
                    break
                write_all(out, chunk)
                offset += len(chunk)
                limit -= len(chunk)
        finally:
            os.close(fd)
        return {"size": st.st_size}
    if op == "write":
        mode, exclusive, append = want_mode(req, 0o644), bool(req.get("exclusive")), bool(req.get("append"))
        if append:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if exclusive else 0)
            fd, _ = open_regular(path, flags, mode)
            try:
                return {"size": copy_in(data_in, fd)}
            finally:
                os.close(fd)
        import stat as S

        try:
            if S.S_ISDIR(os.lstat(path).st_mode):
                raise OSError(errno.EISDIR, "Is a directory")
            if exclusive:
                raise OSError(errno.EEXIST, "File exists")
        except FileNotFoundError:
            pass
        old = None if exclusive else existing_target(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode if old is None else 0o600)
        try:
            try:
                size = copy_in(data_in, fd)
                if old is not None:
                    keep_owner_and_mode(fd, old)
            finally:
                os.close(fd)
            if exclusive:
                os.link(tmp, path)  # fails if path appeared meanwhile: exclusive without a race
                os.unlink(tmp)
            else:
                os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return {"size": size}
    if op == "stat":
        st = os.stat(path) if req.get("follow", True) else os.lstat(path)
        return {
            "type": kind_of(st.st_mode),
            "size": st.st_size,
            "mode": st.st_mode & 0o7777,
            "mtime": st.st_mtime,
            "uid": st.st_uid,
            "gid": st.st_gid,
        }
    if op == "list":
        count, buf = 0, bytearray()
        it = os.scandir(path)
        try:
            for e in it:
                if e.is_symlink():
                    t = b"l"
                elif e.is_dir(follow_symlinks=False):
                    t = b"d"
                elif e.is_file(follow_symlinks=False):
                    t = b"f"
                else:
                    t = b"o"
                buf += t + e.name + b"\0"
                count += 1
                if len(buf) >= 65536:
                    write_all(out, buf)
                    buf = bytearray()
        finally:
            it.close()
        write_all(out, buf)
        return {"count": count}
    if op == "mkdir":
        mode = want_mode(req, 0o755)
        if req.get("parents"):
            make_dirs(path, mode)
        else:
            os.mkdir(path, mode)
        return {}
    if op == "remove":
        import stat as S

        if S.S_ISDIR(os.lstat(path).st_mode):  # lstat: a symlink is removed itself, never followed
            if req.get("recursive"):
                import shutil

                shutil.rmtree(path)  # the fd-based walk: never follows a symlink inside the tree
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
        return {}
    if op == "rename":
        os.rename(path, want_path(req["target"]))
        return {}
    raise ValueError("unknown op %r" % (op,))


def op_error(code: "int", message: "str") -> "dict[str, Any]":
    return {"error": {"errno": code, "name": errno.errorcode.get(code, "EIO"), "message": message}}


def worker(
    req: "dict[str, Any]", out: "int", status_w: "int", data_in: "int | None", tmp: "bytes | None"
) -> "None":
    # In the forked worker: as the command user, with the set-id filter, modes exact (umask 0).
    global SELF
    SELF = os.getpid()
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        keep = set([0, 1, 2, out, status_w] + ([data_in] if data_in is not None else []))
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        os.umask(0)
        if not SETID_STATE[0]:  # the filter is inherited from the agent (or opted out of at its start)
            raise OSError(95, "no set-id seccomp filter for this architecture")
        result = file_op(req, out, data_in, tmp)
    except OSError as e:
        result = op_error(e.errno or errno.EIO, e.strerror or str(e))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        result = op_error(errno.EINVAL, "bad FILE request: %s" % e)
    except BaseException as e:
        result = op_error(errno.EIO, "the file operation failed: %r" % (e,))
    try:
        os.close(out)
        write_all(status_w, json.dumps(result, separators=(",", ":")).encode())
    finally:
        os._exit(0)


# -- the agent ---------------------------------------------------------------------------------------
class Cmd:
    # A command (RUN) or a file operation (FILE) in flight: its channel, pipes and state.
    ch: "int"
    cap: "int"
    tail_cap: "int"
    tail: "dict[int, bytearray]"
    timeout: "float"
    background: "bool"
    stdin: "int | None"
    shim: "int"
    shim_start: "bytes | None"
    sid: "None"
    marker: "bytes"
    status_fd: "int | None"
    status: "bytes"
    status_cap: "int"
    oom_before: "int | None"
    out: "dict[int, int]"
    sent: "dict[int, int]"
    dropped: "dict[int, int]"
    pending: "bytearray"
    stdin_eof: "bool"
    deadline: "float"
    timed_out: "bool"
    killed: "bool"
    shim_done: "int | None"
    drain_until: "Any"  # the time its last output may still come, once its shim or worker ended
    kept: "bool"
    tmp: "bytes | None"  # a file operation's: its worker's pid, start time, temporary file, status
    pid: "int"
    start: "bytes | None"
    done: "int | None"


class Conn:
    # One connection accepted on a listener (the proxy endpoint), or dialed: bytes only, never parsed.
    def __init__(self, sock: "Any", ch: "int", connecting: "int" = 0) -> "None":
        self.sock, self.ch = sock, ch
        self.connecting = connecting  # a DIAL's port while its connect is in progress (0: connected)
        self.fd: "int" = sock.fileno()
        self.credit = WINDOW  # DATA bytes the host still lets us send
        self.pending = bytearray()  # the host's bytes not yet written to the socket (at most WINDOW)
        self.ungranted = 0  # bytes written to the socket whose credit the host has not got back yet
        self.eof_in = False  # the host sent end of file: shut the socket's writing side once flushed
        self.eof_out = False  # the socket's reader ended: end of file sent to the host
        self.shut = False
        self.closing: "float | None" = None  # the host CLOSEd it: flush pending by this time, then close


def direct_connect(path: "str") -> "Any":
    # A non-blocking connection to the host's Unix socket at path, or None (a full backlog is a failure too).
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


class Agent:
    def __init__(self, rfd: "int", wfd: "int", protected: "set[tuple[int, bytes]]", strict: "bool") -> "None":
        self.rfd, self.wfd = rfd, wfd
        self.protected, self.strict = protected, strict
        self.inbuf = bytearray()
        self.cmds: "dict[int, Cmd]" = {}  # channel -> Cmd
        self.shims: "dict[int, Cmd]" = {}  # shim pid -> Cmd
        self.fds: "dict[int, tuple[Cmd, Any]]" = {}  # fd -> (Cmd or Op, what)
        self.ops: "dict[int, Cmd]" = {}  # channel -> Op (a file operation)
        self.workers: "dict[int, Cmd]" = {}  # worker pid -> Op
        self.groups: "dict[int, Cmd]" = {}  # keeper (shim) pid -> the Cmd of a background command that exited
        self.eof = False
        self.listeners: "dict[int, Any]" = {}  # LISTEN channel -> listening socket
        self.conns: "dict[int, Conn]" = {}  # connection channel -> Conn
        self.direct_listeners: "dict[int, tuple[str, bytes]]" = {}  # LISTEN channel -> (socket path, token)
        self.next_conn = CONN_BASE

    def background_count(self) -> "int":
        return len(self.groups) + sum(1 for c in self.cmds.values() if c.background)

    def prune_groups(self, procs: "Procs | None" = None) -> "None":
        # A group ends when its keeper has exited; without subreapers (lenient mode) what it left went
        # to PID 1, so it lasts while a process there still carries its marker.
        if procs is None:
            procs = scan()
        for pid, g in list(self.groups.items()):
            if g.shim_done is None:
                continue
            if not self.strict and any(procs[p][0] == 1 and marker_of(p) == g.marker for p in procs):
                continue
            self.drop_group(g)

    def drop_group(self, g: "Cmd") -> "None":
        self.groups.pop(g.shim, None)
        for fd in list(g.out.values()):
            self.fds.pop(fd, None)
            os.close(fd)
        g.out = {}

    def kill_groups(self) -> "None":
        for g in list(self.groups.values()):
            kill_all(lambda procs: self.group_tree(g, procs), on_reaped=self.reaped)
            self.drop_group(g)

    def group_tree(self, g: "Cmd", procs: "Procs") -> "set[int]":
        found: "set[int]" = set()
        if g.shim in procs and procs[g.shim][2] == g.shim_start:
            found.add(g.shim)
            found |= below([g.shim], procs)
        if not self.strict:  # its processes at PID 1, by its marker
            roots = [p for p, i in procs.items() if i[0] == 1 and marker_of(p) == g.marker]
            found |= set(roots) | below(roots, procs)
        return found

    def out(self, kind: "int", channel: "int", payload: "bytes | dict[str, Any]" = b"") -> "None":
        if isinstance(payload, dict):
            payload = json.dumps(payload, separators=(",", ":")).encode()
        data = HDR.pack(kind, 0, 0, channel, len(payload)) + payload
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.wfd, view)
            except InterruptedError:
                continue
            view = view[n:]

    # RUN ----------------------------------------------------------------------------------------
    def run(self, ch: "int", spec: "dict[str, Any]") -> "None":
        if ch in self.cmds:
            self.out(ERROR, ch, {"message": "channel %d is in use" % ch})
            return
        try:
            argv = [str(a) for a in spec["argv"]]
            env = dict((str(k), str(v)) for k, v in spec["env"].items())
            env["ADK_SANDBOX_EXEC"] = "ch%d-%d" % (ch, SELF)
            c = Cmd()
            c.ch, c.cap = ch, max(int(spec.get("max_output_bytes") or 1048576), 1)
            # Beyond the cap, a window of the latest tail_bytes is kept and sent before EXIT.
            c.tail_cap = max(int(spec.get("tail_bytes") or 0), 0)
            c.tail = {STDOUT: bytearray(), STDERR: bytearray()}
            c.timeout = float(spec.get("timeout", 60))
            want_stdin = bool(spec.get("stdin"))
            c.background = spec.get("background") is True
            spec = {"argv": argv, "env": env, "cwd": str(spec.get("cwd") or "/"), "background": c.background}
            if not argv:
                raise ValueError("empty argv")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            self.out(ERROR, ch, {"message": "bad RUN: %s" % e})
            return
        if c.background and self.background_count() >= MAX_GROUPS:
            self.prune_groups()
            if self.background_count() >= MAX_GROUPS:
                self.out(
                    ERROR,
                    ch,
                    {
                        "refused": True,
                        "message": (
                            "at most %d background commands may keep processes at once in this session (per "
                            "user); end the processes one of them left (they count until the last one exits) or "
                            "run this one without background" % MAX_GROUPS
                        ),
                    },
                )
                return
        pipes: "list[int]" = []
        try:
            if want_stdin:
                r, w = os.pipe()
                pipes += [r, w]
                stdin_r, c.stdin = r, w
            else:
                stdin_r, c.stdin = os.open("/dev/null", os.O_RDONLY), None
                pipes.append(stdin_r)
            or_, ow = os.pipe()
            er, ew = os.pipe()
            sr, sw = os.pipe()
            pipes += [or_, ow, er, ew, sr, sw]
            pid = fork_with_room()
        except OSError as e:
            close_all(pipes)
            self.out(ERROR, ch, {"message": "cannot start the command: %s" % e})
            return
        if pid == 0:
            shim(spec, (stdin_r, ow, ew), sw)
            os._exit(126)
        for fd in (stdin_r, ow, ew, sw):
            os.close(fd)
        c.shim, c.shim_start = pid, start_of(pid)
        c.sid = None
        c.marker = env["ADK_SANDBOX_EXEC"].encode()
        c.status_fd, c.status, c.status_cap = sr, b"", 64
        c.oom_before = oom_kills()
        c.out = {STDOUT: or_, STDERR: er}
        c.sent = {STDOUT: 0, STDERR: 0}
        c.dropped = {STDOUT: 0, STDERR: 0}
        c.pending = bytearray()
        c.stdin_eof = False
        c.deadline = time.monotonic() + c.timeout
        c.timed_out = c.killed = False
        c.shim_done = None
        c.drain_until = None
        for kind, fd in c.out.items():
            nonblock(fd)
            self.fds[fd] = (c, kind)
        nonblock(sr)
        self.fds[sr] = (c, "status")
        if c.stdin is not None:
            nonblock(c.stdin)
        self.cmds[ch] = c
        self.shims[pid] = c

    # killing --------------------------------------------------------------------------------------
    def tree_of(self, c: "Cmd", procs: "Procs") -> "set[int]":
        found: "set[int]" = set()
        if c.shim in procs and procs[c.shim][2] == c.shim_start:
            found.add(c.shim)
            found |= below([c.shim], procs)
        return found | self.strays(procs)

    def strays(self, procs: "Procs") -> "set[int]":
        # Children of the agent that are not live shims: orphans of a shim its command killed.
        live = set(p for p, c in self.shims.items() if c.shim_done is None) | set(self.workers)
        roots = [p for p, i in procs.items() if i[0] == SELF and p not in live]
        return set(roots) | below(roots, procs)

    def escapees(self, procs: "Procs") -> "set[int]":
        # Orphans at PID 1 (not the container's own processes): left by a dead agent, or, without child
        # subreapers, by any command; those attributable to a live command are spared.
        roots = [p for p, i in procs.items() if i[0] == 1 and (p, i[2]) not in self.protected]
        if roots and not self.strict:
            live = [c for c in self.cmds.values() if c.shim_done is None]
            sessions = set(p for p, i in procs.items() if i[0] in set(c.shim for c in live))
            markers = set(c.marker for c in live) | set(g.marker for g in self.groups.values())
            roots = [p for p in roots if procs[p][1] not in sessions and marker_of(p) not in markers]
        return set(roots) | below(roots, procs)

    def kill(self, c: "Cmd") -> "None":
        kill_all(lambda procs: self.tree_of(c, procs), on_reaped=self.reaped)

    def sweep(self) -> "None":
        procs = kill_all(lambda procs: self.strays(procs) | self.escapees(procs), on_reaped=self.reaped)
        if self.groups and not self.strict:
            self.prune_groups(procs)

    def reaped(self, pid: "int", status: "int") -> "None":
        o = self.workers.pop(pid, None)
        if o is not None:
            o.done = status
            o.drain_until = time.monotonic() + 2.0
            return
        c = self.shims.pop(pid, None)
        if c is not None and c.shim_done is None:
            c.shim_done = status
            c.drain_until = time.monotonic() + 2.0
            if c.shim in self.groups and self.strict:
                self.drop_group(c)  # its last process is gone (every orphan came back to the keeper)

    # output ---------------------------------------------------------------------------------------
    def readable(self, fd: "int") -> "bool":
        # True when bytes came (more may be waiting)
        c, what = self.fds[fd]
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self.close_fd(fd)
            return False
        if what == "status":
            c.status += data[: c.status_cap]
            return True
        if getattr(c, "kept", False):
            return True  # a kept group's output, after its command's exit: read and dropped
        self.take(c, what, data)
        return True

    def take(self, c: "Cmd", what: "int", data: "bytes") -> "None":
        room = c.cap - c.sent[what]
        if room > 0:
            part = data[:room]
            c.sent[what] += len(part)
            self.out(what, c.ch, part)
            data = data[len(part) :]
        if getattr(c, "tail_cap", 0) and data:  # a command's stream (file operations keep no tail)
            tail = c.tail[what]
            tail += data
            if len(tail) > 2 * c.tail_cap:  # trimmed in batches: each byte is moved O(1) times
                c.dropped[what] += len(tail) - c.tail_cap
                del tail[: len(tail) - c.tail_cap]
            return
        c.dropped[what] += len(data)

    def close_fd(self, fd: "int") -> "None":
        c, what = self.fds.pop(fd)
        os.close(fd)
        if what == "status":
            c.status_fd = None
        else:
            del c.out[what]

    def write_stdin(self, c: "Cmd") -> "None":
        if c.stdin is None:
            return
        try:
            if c.pending:
                n = os.write(c.stdin, c.pending[:65536])
                del c.pending[:n]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the command stopped reading: drop the rest
            c.pending = bytearray()
            c.stdin_eof = True
        if not c.pending and c.stdin_eof:
            os.close(c.stdin)
            c.stdin = None

    def finish(self, c: "Cmd", keep: "bool" = False) -> "None":
        # keep: a background command that exited; its group's pipes stay open (and drained) until they end
        for fd in ([] if keep else list(c.out.values())) + ([c.status_fd] if c.status_fd is not None else []):
            self.fds.pop(fd, None)
            os.close(fd)
        c.status_fd = None
        if keep:
            c.kept = True
            self.groups[c.shim] = c
        if c.stdin is not None:
            os.close(c.stdin)
        del self.cmds[c.ch]
        for what in (STDOUT, STDERR):
            tail = c.tail[what]
            if len(tail) > c.tail_cap:
                c.dropped[what] += len(tail) - c.tail_cap
                del tail[: len(tail) - c.tail_cap]
            for i in range(0, len(tail), 65536):
                self.out(what, c.ch, bytes(tail[i : i + 65536]))
        code: "int | None" = None
        sig: "int | None" = None
        after = oom_kills()
        ooms = after - c.oom_before if after is not None and c.oom_before is not None else None
        words = c.status.split()
        if c.timed_out or c.killed:
            pass
        elif len(words) == 2 and words[0] == b"E":
            code = int(words[1])
        elif len(words) == 2 and words[0] == b"S":
            sig = int(words[1])
        else:
            sig = signal.SIGKILL  # the shim itself was killed (by its command): as if SIGKILLed
        self.out(
            EXIT,
            c.ch,
            {
                "exit_code": code,
                "signal": sig,
                "timed_out": c.timed_out,
                "stdout_dropped": c.dropped[STDOUT],
                "stderr_dropped": c.dropped[STDERR],
                "oom_kills": ooms,
            },
        )

    # FILE ---------------------------------------------------------------------------------------
    def start_op(self, ch: "int", req: "dict[str, Any]") -> "None":
        if ch in self.cmds or ch in self.ops:
            self.out(RESULT, ch, op_error(errno.EBUSY, "channel %d is in use" % ch))
            return
        o = Cmd()
        o.ch, o.tmp = ch, None
        try:
            op = req["op"]
            if op not in OPS:
                raise ValueError("unknown op %r" % (op,))
            o.cap = want_int(req, "limit") if op == "read" else 1 << 62
            if op == "write" and not req.get("append"):
                # Chosen here, so the agent can remove it if the worker is killed mid-write.
                directory = os.path.dirname(want_path(req["path"]))
                o.tmp = os.path.join(directory, b".adk-sandbox-write-" + os.urandom(8).hex().encode())
        except (KeyError, TypeError, ValueError) as e:
            self.out(RESULT, ch, op_error(errno.EINVAL, "bad FILE request: %s" % e))
            return
        pipes: "list[int]" = []
        try:
            dr, dw = os.pipe()
            sr, sw = os.pipe()
            pipes += [dr, dw, sr, sw]
            in_r: "int | None"
            in_r = o.stdin = None
            if op == "write":
                in_r, o.stdin = os.pipe()
                pipes += [in_r, o.stdin]
            pid = fork_with_room()
        except OSError as e:
            close_all(pipes)
            self.out(RESULT, ch, op_error(e.errno or errno.EIO, "cannot start the file operation: %s" % e))
            return
        if pid == 0:
            worker(req, dw, sw, in_r, o.tmp)
            os._exit(0)
        for fd in [dw, sw] + ([in_r] if in_r is not None else []):
            os.close(fd)
        o.pid, o.start = pid, start_of(pid)
        o.out, o.sent, o.dropped = {STDOUT: dr}, {STDOUT: 0}, {STDOUT: 0}
        o.status_fd, o.status, o.status_cap = sr, b"", 65536
        o.pending, o.stdin_eof = bytearray(), False
        o.done = o.drain_until = None
        o.killed = False
        for fd, what in ((dr, STDOUT), (sr, "status")):
            nonblock(fd)
            self.fds[fd] = (o, what)
        if o.stdin is not None:
            nonblock(o.stdin)
        self.ops[ch] = o
        self.workers[pid] = o

    def op_input(self, o: "Cmd", payload: "bytes") -> "None":
        if o.stdin is None or o.stdin_eof:
            return
        o.pending += struct.pack(">I", len(payload)) + payload  # framed: see copy_in
        o.stdin_eof = not payload
        self.write_stdin(o)

    def kill_op(self, o: "Cmd") -> "None":
        o.killed = True
        if o.stdin is not None:
            os.close(o.stdin)
            o.stdin, o.pending = None, bytearray()
        if o.done is None:
            send(o.pid, o.start, signal.SIGKILL)

    def finish_op(self, o: "Cmd") -> "None":
        for fd in list(o.out.values()) + ([o.status_fd] if o.status_fd is not None else []):
            self.fds.pop(fd, None)
            os.close(fd)
        if o.stdin is not None:
            os.close(o.stdin)
        del self.ops[o.ch]
        result: "Any" = None
        try:
            result = json.loads(o.status.decode())  # a worker that finished before a KILL: its result
        except ValueError:
            pass
        if not isinstance(result, dict):
            if o.killed:
                result = op_error(errno.ECANCELED, "the file operation was cancelled")
            else:
                result = op_error(errno.EIO, "the file operation's worker ended without a result")
        if "error" in result and o.tmp is not None:
            try:
                os.unlink(o.tmp)  # a write that did not finish: its temporary file goes
            except OSError:
                pass
        self.out(RESULT, o.ch, result)

    # connections (the proxy endpoint) ---------------------------------------------------------------
    def listen(self, ch: "int", payload: "bytes") -> "None":
        import socket

        try:
            body = json.loads(payload.decode())
            port = body["port"] if isinstance(body, dict) else None
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError("LISTEN needs a port 0..65535")
            address = body.get("address", "127.0.0.1")
            try:
                packed = socket.inet_pton(socket.AF_INET, address)
            except (OSError, TypeError):
                packed = b""
            if packed[:1] != b"\x7f":
                raise ValueError("the address must be an IPv4 address in 127.0.0.0/8")
            unix, token = body.get("unix"), body.get("token")
            if (unix is None) != (token is None):
                raise ValueError("unix and token go together")
            if unix is not None and not (
                isinstance(unix, str)
                and unix.startswith("/")
                and len(unix.encode()) <= 107
                and isinstance(token, str)
                and 16 <= len(token) <= 256
                and token.isascii()
            ):
                raise ValueError("unix must be an absolute path and token 16..256 bytes")
            if ch in self.listeners or ch >= CONN_BASE or len(self.listeners) >= MAX_LISTENERS:
                raise OSError(errno.EBUSY, "no room for another listener")
        except (ValueError, KeyError) as e:
            self.out(RESULT, ch, op_error(errno.EINVAL, "bad LISTEN: %s" % e))
            return
        except OSError as e:
            self.out(RESULT, ch, op_error(e.errno or errno.EIO, str(e)))
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            why = "cannot listen on %s:%d: %s" % (address, port, e.strerror or e)
            self.out(RESULT, ch, op_error(e.errno or errno.EIO, why))
            return
        self.listeners[ch] = sock
        answer: "dict[str, Any]" = {"port": sock.getsockname()[1]}
        if unix is not None:
            probe = direct_connect(unix)  # closed at once without a byte: the host logs nothing for it
            if probe is not None:
                probe.close()
                self.direct_listeners[ch] = (unix, token.encode())
            answer["mode"] = "unix" if probe is not None else "frames"
        self.out(RESULT, ch, answer)

    def accept(self, lch: "int") -> "None":
        sock = self.listeners[lch]
        for _ in range(64):  # a burst, then back to the loop (commands and other connections go on)
            try:
                client, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: this connection waits in the backlog
                return
            if len(self.conns) >= MAX_CONNS or self.next_conn >= DIAL_BASE:
                client.close()  # refused: the connection cap holds
                continue
            if lch in self.direct_listeners:
                self.direct_open(lch, client)  # left blocking: the host splices it
                continue
            client.setblocking(False)
            n = Conn(client, self.next_conn)
            self.next_conn += 1
            self.conns[n.ch] = n
            self.out(OPEN, n.ch, {"listener": lch})

    def direct_open(self, lch: "int", client: "Any") -> "None":
        # To the host's socket: the token, then one byte carrying the client's socket (SCM_RIGHTS). The host
        # serves the socket itself; both descriptors here are closed at once (a failure: the client's ends).
        import array
        import socket

        path, token = self.direct_listeners[lch]
        host = direct_connect(path)
        try:
            # A fresh socket's buffer takes the token and the byte whole; a short write is a failure.
            if host is not None and host.send(token) == len(token):
                fds = array.array("i", [client.fileno()])
                host.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError:
            pass
        finally:
            if host is not None:
                host.close()
            client.close()

    def dial(self, ch: "int", payload: "bytes") -> "None":
        # The host opens a connection into this sandbox: to 127.0.0.1:port only, answered OPEN or CLOSE.
        import socket

        if ch in self.conns:
            raise SystemExit("adk-sandbox-agent: DIAL on channel %d, which is in use" % ch)
        try:
            body = json.loads(payload.decode())
            port = body["port"] if isinstance(body, dict) else None
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(port)
        except (ValueError, KeyError):
            self.out(CLOSE, ch, {"error": "bad DIAL: it needs a port 1..65535"})
            return
        if len(self.conns) >= MAX_CONNS:
            self.out(CLOSE, ch, {"error": "too many connections (%d)" % MAX_CONNS})
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.out(CLOSE, ch, {"error": "connect to 127.0.0.1:%d: %s" % (port, os.strerror(code))})
            return
        n = Conn(sock, ch, port)
        self.conns[ch] = n
        if code == 0:
            self.connected(n)

    def connected(self, n: "Conn") -> "None":
        # A dialed connection's connect ended: OPEN when it succeeded, else CLOSE with why.
        import socket

        port, n.connecting = n.connecting, 0
        code = n.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.abort_conn(n, "connect to 127.0.0.1:%d: %s" % (port, os.strerror(code)))
            return
        self.out(OPEN, n.ch, {"port": port})
        self.conn_write(n)  # nothing is pending: the host sends nothing before OPEN

    def conn_frame(self, kind: "int", ch: "int", payload: "bytes") -> "None":
        n = self.conns.get(ch)
        if n is None:
            return  # a connection already forgotten (or never ours): late frames are dropped
        if n.connecting and kind == CLOSE:
            self.drop_conn(n)  # the host gave the connect up
            return
        if kind == DATA:
            if n.eof_in or n.closing is not None:
                return
            if not payload:
                n.eof_in = True
            elif len(n.pending) + len(payload) > WINDOW:
                self.abort_conn(n, "the host sent more than the window")
                return
            else:
                n.pending += payload
            self.conn_write(n)
        elif kind == CREDIT:
            try:
                amount = json.loads(payload.decode())["bytes"]
                if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
                    raise ValueError(amount)
            except (ValueError, KeyError, TypeError):
                self.abort_conn(n, "bad CREDIT")
                return
            n.credit = min(n.credit + amount, 1 << 40)
        else:  # CLOSE: the host is done; write what it sent, then close (no answer)
            n.closing = time.monotonic() + LINGER
            n.eof_in = True
            self.conn_write(n)

    def conn_events(self, r: "list[int]", w: "list[int]") -> "None":
        if not self.listeners and not self.conns:
            return
        by_fd = dict((n.fd, n) for n in self.conns.values())
        for fd in w:
            n = by_fd.get(fd)
            if n is not None and n.ch in self.conns:
                if n.connecting:
                    self.connected(n)
                else:
                    self.conn_write(n)
        for lch, sock in list(self.listeners.items()):
            if sock.fileno() in r:
                self.accept(lch)
        for fd in r:
            n = by_fd.get(fd)
            if n is not None and n.ch in self.conns:
                self.conn_read(n)

    def conn_read(self, n: "Conn") -> "None":
        if n.credit <= 0 or n.eof_out or n.closing is not None:
            return
        try:
            data = n.sock.recv(min(n.credit, 65536))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.abort_conn(n, "read: %s" % (e.strerror or e))
            return
        if data:
            n.credit -= len(data)
            self.out(DATA, n.ch, data)
            return
        n.eof_out = True
        self.out(DATA, n.ch, b"")
        self.conn_done(n)

    def conn_write(self, n: "Conn") -> "None":
        if n.connecting:
            return
        while n.pending:
            try:
                sent = n.sock.send(n.pending[:65536])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if n.closing is not None:
                    self.drop_conn(n)
                else:
                    self.abort_conn(n, "write: %s" % (e.strerror or e))
                return
            del n.pending[:sent]
            n.ungranted += sent
        if n.closing is None and n.ungranted >= WINDOW // 4:
            self.out(CREDIT, n.ch, {"bytes": n.ungranted})
            n.ungranted = 0
        if n.pending:
            return
        if n.closing is not None:
            self.drop_conn(n)
            return
        if n.eof_in and not n.shut:
            n.shut = True
            try:
                import socket

                n.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self.conn_done(n)

    def conn_done(self, n: "Conn") -> "None":
        # Both directions ended and everything written: the connection is over.
        if n.eof_out and n.eof_in and n.shut and not n.pending and n.ch in self.conns:
            self.out(CLOSE, n.ch, {})
            self.drop_conn(n)

    def abort_conn(self, n: "Conn", why: "str") -> "None":
        self.out(CLOSE, n.ch, {"error": why})
        self.drop_conn(n)

    def drop_conn(self, n: "Conn") -> "None":
        self.conns.pop(n.ch, None)
        try:
            n.sock.close()
        except OSError:
            pass

    def close_conns(self) -> "None":
        for sock in self.listeners.values():
            sock.close()
        self.listeners = {}
        self.direct_listeners = {}
        for n in list(self.conns.values()):
            self.drop_conn(n)

    # frames from the host -------------------------------------------------------------------------
    def frames(self) -> "None":
        while len(self.inbuf) >= HDR.size:
            kind, flags, res, ch, n = HDR.unpack_from(self.inbuf)
            if n > MAXP:
                raise SystemExit("adk-sandbox-agent: oversized frame from the host")
            if len(self.inbuf) < HDR.size + n:
                return
            payload = bytes(self.inbuf[HDR.size : HDR.size + n])
            del self.inbuf[: HDR.size + n]
            c = self.cmds.get(ch)
            if kind == RUN:
                try:
                    body = json.loads(payload.decode())
                except ValueError as e:
                    self.out(ERROR, ch, {"message": "bad RUN: %s" % e})
                    continue
                self.run(ch, body)
            elif kind == FILE:
                try:
                    body = json.loads(payload.decode())
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    self.out(RESULT, ch, op_error(errno.EINVAL, "bad FILE request: %s" % e))
                    continue
                self.start_op(ch, body)
            elif kind == STDIN and ch in self.ops:
                self.op_input(self.ops[ch], payload)
            elif kind == LISTEN:
                self.listen(ch, payload)
            elif kind in (DATA, CREDIT, CLOSE):
                self.conn_frame(kind, ch, payload)
            elif kind == DIAL and ch >= DIAL_BASE:
                self.dial(ch, payload)
            elif kind == KILL and ch in self.listeners:
                self.listeners.pop(ch).close()
                self.direct_listeners.pop(ch, None)
            elif kind == KILL and ch in self.ops:
                self.kill_op(self.ops[ch])
            elif kind == STDIN:
                if c is not None and c.stdin is not None and not c.stdin_eof:
                    if payload:
                        c.pending += payload
                    else:
                        c.stdin_eof = True
                    self.write_stdin(c)
            elif kind == KILL:
                if c is not None and c.shim_done is None:
                    c.killed = True
                    self.kill(c)
            elif kind == PING:
                self.out(PONG, 0, payload or b"{}")

    def loop(self, wake: "int") -> "None":
        while True:
            now = time.monotonic()
            for c in list(self.cmds.values()):
                if c.shim_done is None and now >= c.deadline:
                    c.timed_out = True
                    self.kill(c)
            for pid, status in reap_any():
                self.reaped(pid, status)
            swept = False
            for c in list(self.cmds.values()):
                if c.background and not (c.timed_out or c.killed):
                    if c.status_fd is not None:
                        self.readable(c.status_fd)
                    if b"\n" in c.status:
                        # The command exited: what it wrote is in its pipes already (what it left may
                        # hold them open); read that, then EXIT, and the shim stays as the keeper.
                        for fd in list(c.out.values()):
                            while fd in self.fds and self.readable(fd):
                                pass
                        self.finish(c, keep=True)
                        if c.shim_done is not None and self.strict:
                            self.drop_group(c)  # its keeper is gone already: nothing was left
                        continue
                if c.shim_done is not None:
                    if c.status_fd is not None:
                        self.readable(c.status_fd)  # written before the shim exited
                    if not swept and (not self.strict or not c.status.strip()):
                        # Strays of a shim its command killed; without subreapers, orphans at PID 1.
                        self.sweep()
                        swept = True
                    if (not c.out and c.status_fd is None) or time.monotonic() > c.drain_until:
                        self.finish(c)
            for o in list(self.ops.values()):
                if o.done is not None and ((not o.out and o.status_fd is None) or now > o.drain_until):
                    if o.status_fd is not None:
                        self.readable(o.status_fd)
                    self.finish_op(o)
            for n in list(self.conns.values()):
                if n.closing is not None and time.monotonic() >= n.closing:
                    self.drop_conn(n)  # a client that does not read what the host sent: given up
            if self.eof and not self.cmds and not self.ops:
                return
            rlist = [wake] + list(self.fds) + [sock.fileno() for sock in self.listeners.values()]
            rlist += [
                n.fd
                for n in self.conns.values()
                if n.credit > 0 and not n.eof_out and n.closing is None and not n.connecting
            ]
            if not self.eof:
                rlist.append(self.rfd)
            pipes = list(self.cmds.values()) + list(self.ops.values())
            wlist = [c.stdin for c in pipes if c.stdin is not None and c.pending]
            wlist += [n.fd for n in self.conns.values() if n.pending or n.connecting]
            waits = [c.deadline for c in self.cmds.values() if c.shim_done is None]
            waits += [c.drain_until for c in pipes if c.drain_until is not None]
            waits += [n.closing for n in self.conns.values() if n.closing is not None]
            timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
            try:
                r, w, _ = select.select(rlist, wlist, [], timeout)
            except InterruptedError:
                continue
            self.conn_events(r, w)
            for fd in w:
                for c in pipes:
                    if c.stdin == fd:
                        self.write_stdin(c)
            for fd in r:
                if fd == wake:
                    try:
                        while os.read(wake, 4096):
                            pass
                    except (BlockingIOError, InterruptedError):
                        pass
                elif fd == self.rfd:
                    try:
                        data = os.read(self.rfd, 1 << 20)
                    except InterruptedError:
                        continue
                    if not data:
                        self.eof = True  # the host went away: every command dies
                        for c in list(self.cmds.values()):
                            if c.shim_done is None:
                                c.killed = True
                                self.kill(c)
                        for o in list(self.ops.values()):
                            self.kill_op(o)
                        self.kill_groups()
                        self.close_conns()
                        continue
                    self.inbuf += data
                    self.frames()
                elif fd in self.fds:
                    self.readable(fd)


def other_agents(procs: "Procs") -> "list[int]":
    # Exec roots (ppid 0) that are agents, by their name's place on the argv (whatever follows it: the
    # opt-in word, the protected list): a Python agent's (after the script) or a static agent's (argv[0]),
    # as agent.c's is_other_agent reads them.
    found: "list[int]" = []
    for p, info in procs.items():
        if p != SELF and info[0] == 0:
            a = argv_of(p)
            python = len(a) > 5 and a[1:4] == [b"-I", b"-S", b"-c"] and a[5] == b"adk-sandbox-agent"
            if python or a[:1] == [b"adk-sandbox-agent"]:
                found.append(p)
    return found


# What HELLO reports as "setid", and whether anything may start: "refused" (the set-id filter is on the
# agent, so on every shim, worker and command it starts), "allowed" (started with SETID_ALLOWED_WORD: no
# filter, by the host's choice), or "" (no filter could be installed: every RUN and FILE is refused, and
# HELLO says "unavailable").
SETID_STATE = [""]
# The opt-in word (executor/channel/agent.py SETID_ALLOWED_WORD): only right after the agent's name, so it
# can never be read as the protected list (digits, ":" and ","), nor a protected list as it.
SETID_ALLOWED_WORD = "setid-allowed"


def parse_args(args: "list[str]") -> "tuple[bool, str | None]":
    # [setid-allowed] [<protected>]: anything else ends the agent before it does anything (fail closed).
    allowed = bool(args) and args[0] == SETID_ALLOWED_WORD
    rest = args[1:] if allowed else args
    if len(rest) > 1:
        os.write(2, b"adk-sandbox-agent: usage: adk-sandbox-agent [setid-allowed] [<protected>]\n")
        sys.exit(2)
    return allowed, rest[0] if rest else None


def main() -> "None":
    prctl(4, 0)  # PR_SET_DUMPABLE 0: commands cannot open /proc/<agent>/fd or ptrace the agent
    setid_allowed, protected_arg = parse_args(sys.argv[2:])
    # Once, here, rather than in every shim (ctypes costs ~1 ms a command): the agent never needs a set-id
    # mode itself. Without a filter for this architecture the agent still runs but refuses every RUN.
    # With the opt-in word (a sandbox whose workspace never reaches the host as a bind mount, where
    # package managers must install set-uid programs) no filter is installed at all.
    if setid_allowed:
        SETID_STATE[0] = "allowed"
    elif SETID is not None:
        try:
            install_setid_filter(SETID)
            SETID_STATE[0] = "refused"
        except OSError as e:
            os.write(2, ("adk-sandbox-agent: %s\n" % e).encode())
    rfd, wfd = os.dup(0), os.dup(1)  # private (close-on-exec) copies of the framing pipes
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    strict = prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    for s in (signal.SIGPIPE, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(s, signal.SIG_IGN)
    wr, ww = os.pipe()
    nonblock(wr)
    nonblock(ww)
    signal.signal(signal.SIGCHLD, lambda s, f: None)
    signal.set_wakeup_fd(ww)
    procs = scan()
    if protected_arg is not None:
        protected = parse_protected(protected_arg)
    else:
        mine = set([1]) | below([1], procs)
        protected = set((p, procs[p][2]) for p in mine if p in procs)
    agent = Agent(rfd, wfd, protected, strict)
    # What earlier agents of this container left: another agent (the host gave up on it) and its tree,
    # and orphans at PID 1. The old agent is stopped first and killed last: under gVisor a descendant that
    # dies with its exec'd subreaper stops the whole sandbox (see the end of main).
    olds = other_agents(procs)
    for p in olds:
        send(p, procs[p][2], signal.SIGSTOP)
    kill_all(lambda procs: below(olds, procs) | agent.escapees(procs))
    kill_all(lambda procs: set(olds))
    agent.out(
        HELLO,
        0,
        {
            "protocol": 1,
            "pid": SELF,
            "subreaper": strict,
            "protected": ",".join("%d:%s" % (p, s.decode()) for p, s in sorted(protected)),
            "python": "%d.%d" % sys.version_info[:2],
            "agent": "python",
            "ops": OPS,
            "setid": SETID_STATE[0] or "unavailable",
            "proxy": 1,
            "dial": 1,
            "unix": 2,
        },
    )
    try:
        agent.loop(wr)
    finally:
        # Nothing below the agent may still be dying when it exits: under gVisor an exec'd process has no
        # parent, and a subreaper's descendant whose exit overlaps its subreaper's is taken for the
        # namespace's init, which kills every process of the sandbox (runsc 20240729). Zombies are fine.
        kill_all(lambda procs: below([SELF], procs))


main()
