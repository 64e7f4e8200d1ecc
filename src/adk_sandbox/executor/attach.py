"""Terminals in a session that another process owns: ``adk-sandbox attach SESSION``.

The owner's :class:`AttachServer` serves terminals of its session on a Unix socket
(:func:`socket_path`, in :func:`socket_directory`), speaking a subset of the agent's framing;
:class:`RemoteTerminal` is the client's side. See docs/terminals.md, section "attach".
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from adk_sandbox.executor.channel.frames import (
    AGENT_TO_HOST,
    HOST_TO_AGENT,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
)
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError, SandboxFailedError

__all__ = ["AttachServer", "RemoteTerminal", "TerminalSession", "socket_directory", "socket_path"]

_CHANNEL = 1
_RECV = 256 * 1024
_SESSION_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class TerminalSession(Protocol):
    """What :class:`AttachServer` serves: a session's id and its ``open_pty``."""

    @property
    def session_id(self) -> str:
        """The session's id (names the socket)."""
        ...

    def open_pty(
        self, argv: list[str] | None = None, *, rows: int = 24, cols: int = 80, user: str | None = None
    ) -> Any:
        """A program on a new terminal of the session."""
        ...


def socket_directory() -> Path:
    """The directory of this user's attach sockets, made if missing; refused when others could enter it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "adk-sandbox"
        if runtime
        else Path(tempfile.gettempdir()) / f"adk-sandbox-{os.getuid()}"
    )
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700, parents=bool(runtime))
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PolicyNotEnforceableError(
            f"{base} is not a directory of this user's alone (owner {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): attach sockets are not served from it"
        )
    return base


def socket_path(session_id: str) -> Path:
    """Where the session's attach socket is (:class:`InvalidRequestError` for an id that is no name)."""
    if not session_id or len(session_id) > 64 or not set(session_id) <= _SESSION_ID:
        raise InvalidRequestError(f"{session_id!r} is not a session id (letters, digits, - _ .; at most 64)")
    return socket_directory() / f"{session_id}.sock"


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class AttachServer:
    """Serves terminals of ``session`` to this user's other processes, until :meth:`close`."""

    def __init__(self, session: TerminalSession) -> None:
        self._session = session
        self.path = socket_path(session.session_id)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()  # a socket left by an owner that died (the session id is unique)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._listener.listen(16)
        self._closed = False
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="adk-sandbox-attach", daemon=True).start()

    @property
    def command(self) -> str:
        """The command that attaches to this session."""
        return f"adk-sandbox attach {self._session.session_id}"

    def close(self) -> None:
        """Stop serving: the socket goes, every attached terminal ends; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live, self._live = list(self._live), set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        for conn in live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if _peer_uid(conn) not in (os.getuid(), 0):
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._live.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="adk-sandbox-attached", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        terminal: Any = None
        try:
            hello = {"protocol": 1, "pid": os.getpid(), "subreaper": False, "agent": "attach",
                     "session": self._session.session_id}  # fmt: skip
            conn.sendall(encode(FrameType.HELLO, 0, hello))
            decoder = FrameDecoder(HOST_TO_AGENT, expect_hello=False)
            frames = _first_frames(conn, decoder)
            run = frames.pop(0)
            if run.type != FrameType.RUN or run.channel != _CHANNEL or run.body is None:
                raise ProtocolError("the first frame is not a RUN on channel 1")
            argv, user = run.body.get("argv"), run.body.get("user")
            try:
                terminal = self._session.open_pty(
                    list(argv) if isinstance(argv, list) else None,
                    rows=int(run.body.get("rows", 24)),
                    cols=int(run.body.get("cols", 80)),
                    user=user if isinstance(user, str) else None,
                )
            except (InvalidRequestError, SandboxFailedError, PolicyNotEnforceableError, TypeError) as exc:
                conn.sendall(encode(FrameType.ERROR, _CHANNEL, {"message": str(exc)}))
                return
            threading.Thread(target=_show, args=(terminal, conn), daemon=True).start()
            while True:
                for frame in frames:
                    _apply(terminal, frame)
                data = conn.recv(_RECV)
                if not data:
                    return
                frames = decoder.feed(data)
        except (OSError, ProtocolError, InvalidRequestError, SandboxFailedError):
            return
        finally:
            if terminal is not None:
                terminal.close()
            with self._lock:
                self._live.discard(conn)
            conn.close()


def _first_frames(conn: socket.socket, decoder: FrameDecoder) -> list[Any]:
    frames: list[Any] = []
    while not frames:
        data = conn.recv(_RECV)
        if not data:
            raise ConnectionResetError(errno.ECONNRESET, "the client left before its RUN")
        frames = decoder.feed(data)
    return frames


def _apply(terminal: Any, frame: Any) -> None:
    """A client's frame on the terminal it attached."""
    body = frame.body or {}
    if frame.type == FrameType.STDIN:
        terminal.write(frame.data)
    elif frame.type == FrameType.RESIZE:
        terminal.resize(body["rows"], body["cols"])
    elif frame.type == FrameType.SIGNAL:
        terminal.signal(body["signal"])
    elif frame.type == FrameType.KILL:
        terminal.close()
    else:
        raise ProtocolError(f"{frame.type.name} is not a frame of an attached terminal")


def _show(terminal: Any, conn: socket.socket) -> None:
    """The terminal's output to the client, then its EXIT (the client's pace: sendall blocks)."""
    with contextlib.suppress(OSError, SandboxFailedError):
        while data := terminal.read():
            conn.sendall(encode(FrameType.STDOUT, _CHANNEL, data))
        code = terminal.exit_code
        conn.sendall(encode(FrameType.EXIT, _CHANNEL, {
            "exit_code": code if code is not None and code <= 255 else None, "signal": None,
            "timed_out": False, "stdout_dropped": 0, "stderr_dropped": 0,
        }))  # fmt: skip
        conn.shutdown(socket.SHUT_WR)


class RemoteTerminal:
    """A terminal of a session another process owns, through its :class:`AttachServer` (the relay's side)."""

    def __init__(
        self,
        session_id: str,
        argv: list[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        user: str | None = None,
    ) -> None:
        path = socket_path(session_id)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise InvalidRequestError(
                f"no session {session_id} is served here ({exc.strerror}): its owner must still run it "
                "(adk-sandbox shell, or an inspect eval asked for its connection)"
            ) from None
        self._decoder = FrameDecoder(AGENT_TO_HOST)
        self._pending: list[Any] = []
        self._exit: dict[str, Any] | None = None
        self._lock = threading.Lock()
        body: dict[str, Any] = {
            "argv": argv,
            "env": {},
            "pty": True,
            "rows": rows,
            "cols": cols,
            "user": user,
        }
        self._sock.sendall(encode(FrameType.RUN, _CHANNEL, body))

    @property
    def exit_code(self) -> int | None:
        """The program's exit status once it ended."""
        return None if self._exit is None else self._exit.get("exit_code")

    def write(self, data: bytes) -> None:
        """Send keystrokes."""
        with self._lock:
            self._sock.sendall(encode(FrameType.STDIN, _CHANNEL, data))

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size."""
        with self._lock:
            self._sock.sendall(encode(FrameType.RESIZE, _CHANNEL, {"rows": rows, "cols": cols}))

    def signal(self, sig: int) -> None:
        """Signal the terminal's foreground process group."""
        with self._lock:
            self._sock.sendall(encode(FrameType.SIGNAL, _CHANNEL, {"signal": sig}))

    def read(self, timeout: float | None = None) -> bytes:
        """What the program showed (``b""`` at its end); :class:`TimeoutError` after ``timeout`` seconds."""
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._pending:
                frame = self._pending.pop(0)
                if frame.type == FrameType.STDOUT:
                    return bytes(frame.data)
                if frame.type == FrameType.EXIT:
                    self._exit = frame.body
                    return b""
                if frame.type == FrameType.ERROR:
                    raise SandboxFailedError(f"the session's owner could not open a terminal: {frame.body}")
            if self._exit is not None:
                return b""
            left = None if until is None else max(until - time.monotonic(), 0.0)
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(_RECV)
            except TimeoutError:
                raise TimeoutError("the terminal wrote nothing in the time given") from None
            if not data:
                raise SandboxFailedError("the session's owner closed the connection (the session ended)")
            self._pending += [f for f in self._decoder.feed(data) if f.type != FrameType.HELLO]

    def __enter__(self) -> RemoteTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the program if it runs and leave; idempotent."""
        with contextlib.suppress(OSError):
            if self._exit is None:
                with self._lock:
                    self._sock.sendall(encode(FrameType.KILL, _CHANNEL))
        self._sock.close()
