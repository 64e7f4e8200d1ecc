"""How a command reaches a session container and how its process tree is killed there.

This is the one small interface between a :class:`DockerSession` and the container
(:class:`CommandTransport`): run a prepared command with a deadline, feed its output to the shared
capture, kill its whole tree. :class:`DockerExecTransport` implements it with Docker's exec API; a faster
channel (a long-lived agent in the container) can replace it without touching the session.

Process-tree killing inside the container (Docker's exec API does not do it: killing the client leaves
the process running). Every command runs under a small POSIX ``sh`` wrapper that starts it with a
cleared environment carrying a marker, ``ADK_SANDBOX_EXEC=<id>``. Children inherit the marker across
``setsid``, double forks and ignored signals, so the kill finds them all through ``/proc/*/environ``.
A process that also clears its environment would escape the marker, so when no other command of the
session is running and the command's user is not root, the kill also signals every process of that user
(``kill -9 -1``); the container's keeper process runs as root and survives it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import ClassVar, Protocol

import docker
import docker.errors

from executor._output import OutputCapture
from executor.backends.docker._daemon import daemon_errors, idempotent
from executor.errors import SandboxFailedError
from executor.types import Stream

__all__ = [
    "MARKER_VARIABLE",
    "CommandOutcome",
    "CommandTransport",
    "ContainerGoneError",
    "DockerExecTransport",
    "FrameDemultiplexer",
    "PreparedCommand",
]

log = logging.getLogger(__name__)

MARKER_VARIABLE = "ADK_SANDBOX_EXEC"

# Runs the command (argv after the marker), then kills whatever it left behind, as the host backend does
# after a normal exit. Only shell builtins and one grep run, so it costs about a millisecond.
_KILL_MARKED = (
    "for _pass in 1 2 3 4 5 6 7 8 9 10; do _found=; "
    'for _f in $(grep -lzxF "' + MARKER_VARIABLE + '=$1" /proc/[0-9]*/environ 2>/dev/null); do '
    '_p=${_f#/proc/}; kill -9 "${_p%/environ}" 2>/dev/null && _found=1; done; '
    '[ -z "$_found" ] && break; done'
)
WRAPPER_SCRIPT = '_m=$1; shift; "$@"; _rc=$?; set -- "$_m"; ' + _KILL_MARKED + "; exit $_rc"

# Kills one command's tree: by marker always; with "all", every process of this user as well.
KILLER_SCRIPT = (
    'if [ "$2" = all ]; then _n=0; '
    "while kill -9 -1 2>/dev/null && [ $_n -lt 100 ]; do _n=$((_n+1)); done; fi; " + _KILL_MARKED
)

#: After the kill, how long the remaining output may take to drain before the stream is closed.
DRAIN_AFTER_KILL_SECONDS = 2.0
#: How often a cancel event is polled while waiting for output.
CANCEL_POLL_SECONDS = 0.05
_READ_SIZE = 65536


class ContainerGoneError(SandboxFailedError):
    """The container stopped or vanished before the command could start (nothing ran)."""


@dataclass(frozen=True)
class PreparedCommand:
    """A command ready for the container: the program, its environment and where and as whom it runs."""

    argv: tuple[str, ...]
    env: dict[str, str]
    user: str
    workdir: str
    stdin: bytes | None
    marker: str


@dataclass(frozen=True)
class CommandOutcome:
    """How a command ended (its output went to the capture)."""

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    kill_failed: bool = False
    """The tree could not be killed from inside (e.g. a fork bomb left no room for the killer)."""


class CommandTransport(Protocol):
    """Runs commands in one container and kills their process trees."""

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
        kill_everything: bool,
    ) -> CommandOutcome:
        """Run ``command`` until it ends or ``deadline`` (monotonic) passes or ``cancel`` is set.

        On the deadline or cancellation the command's whole tree is killed (``kill_everything``: every
        process of its user too) and the output produced so far stays in ``capture``.
        """
        ...


class FrameDemultiplexer:
    """Splits Docker's multiplexed attach stream (8-byte headers: stream, 0, 0, 0, big-endian size)."""

    _STREAMS: ClassVar[dict[int, Stream]] = {1: "stdout", 2: "stderr"}

    def __init__(self, capture: OutputCapture) -> None:
        self._capture = capture
        self._buffer = bytearray()
        self._stream: Stream | None = None
        self._remaining = 0

    def feed(self, data: bytes) -> None:
        """Consume bytes as they arrive; payloads go to the capture without being copied twice."""
        view = memoryview(data)
        while view:
            if self._remaining:
                part = view[: self._remaining]
                self._remaining -= len(part)
                if self._stream is not None:
                    self._capture.feed(self._stream, bytes(part))
                view = view[len(part) :]
                continue
            need = 8 - len(self._buffer)
            self._buffer += view[:need]
            view = view[need:]
            if len(self._buffer) == 8:
                kind, size = struct.unpack(">BxxxL", self._buffer)
                self._buffer.clear()
                self._stream = self._STREAMS.get(kind)  # 0 (stdin echo) is not expected; dropped
                self._remaining = size


class DockerExecTransport:
    """:class:`CommandTransport` over Docker's exec API, streaming straight from the daemon's socket."""

    def __init__(self, client: docker.DockerClient, container_id: str, socket_path: str) -> None:
        self._client = client
        self._container_id = container_id
        self._socket_path = socket_path
        self._api_version = client.api.api_version

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
        kill_everything: bool,
    ) -> CommandOutcome:
        """See :meth:`CommandTransport.run`."""
        argv = [
            "/bin/sh", "-c", WRAPPER_SCRIPT, "adk-sandbox", command.marker,
            "env", "-i", *(f"{k}={v}" for k, v in command.env.items()),
            f"{MARKER_VARIABLE}={command.marker}", *command.argv,
        ]  # fmt: skip
        exec_id = self._create_exec(
            argv, command.user, command.workdir, attach_stdin=command.stdin is not None
        )
        sock, early = self._start_exec(exec_id)
        stopped: str | None = None
        kill_failed = False
        try:
            demux = FrameDemultiplexer(capture)
            demux.feed(early)
            stopped = _pump(sock, demux, command.stdin, deadline, cancel)
            if stopped is not None:
                kill_failed = not self.kill(command, kill_everything=kill_everything)
                _pump(sock, demux, None, time.monotonic() + DRAIN_AFTER_KILL_SECONDS, None)
        finally:
            sock.close()
        exit_code = None if stopped else self._exit_code(exec_id)
        return CommandOutcome(
            exit_code=exit_code,
            timed_out=stopped == "timeout",
            cancelled=stopped == "cancel",
            kill_failed=kill_failed,
        )

    def kill(self, command: PreparedCommand, *, kill_everything: bool) -> bool:
        """Kill ``command``'s tree from inside the container; False when the killer could not run."""
        argv = ["/bin/sh", "-c", KILLER_SCRIPT, "adk-sandbox-kill", command.marker]
        if kill_everything:
            argv.append("all")
        for attempt in range(5):
            try:
                with daemon_errors():
                    result = self._client.api.exec_create(self._container_id, argv, user=command.user)
                    self._client.api.exec_start(result["Id"])
                    status = self._client.api.exec_inspect(result["Id"])
            except SandboxFailedError as exc:
                log.info("killer could not start (attempt %d): %s", attempt + 1, exc)
                time.sleep(0.05 * (attempt + 1))
                continue
            # 126/127: the killer itself could not be started (no room for a process, e.g. a fork bomb).
            if status.get("ExitCode") not in (126, 127):
                return True
            time.sleep(0.05 * (attempt + 1))
        return False

    def _create_exec(self, argv: list[str], user: str, workdir: str, *, attach_stdin: bool) -> str:
        with daemon_errors():
            try:
                created = self._client.api.exec_create(
                    self._container_id, argv, stdin=attach_stdin, user=user, workdir=workdir
                )
            except docker.errors.APIError as exc:
                # 404: the container vanished; 409: it is not running. Either way nothing started.
                if exc.status_code in (404, 409):
                    raise ContainerGoneError(f"the sandbox container cannot run commands: {exc}") from exc
                raise
        return str(created["Id"])

    def _start_exec(self, exec_id: str) -> tuple[socket.socket, bytes]:
        """Start the exec over a raw hijacked connection; return the socket and any bytes already read.

        docker-py's socket mode hands out the socket behind a buffered HTTP reader, which may already hold
        the first output bytes; speaking the two-message HTTP upgrade directly avoids losing them.
        """
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        request = (
            f"POST /v{self._api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._socket_path)
            sock.sendall(request)
            received = bytearray()
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(_READ_SIZE)
                if not chunk:
                    raise SandboxFailedError("the Docker daemon closed the exec connection before answering")
                received += chunk
            head, _, rest = bytes(received).partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status not in (101, 200):
                message = _read_error_body(sock, head, rest)
                if status in (404, 409):
                    raise ContainerGoneError(f"the sandbox container cannot run commands: {message}")
                raise SandboxFailedError(
                    f"the Docker daemon refused to start a command ({status}): {message}"
                )
        except OSError as exc:
            sock.close()
            raise SandboxFailedError(f"lost the connection to the Docker daemon: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return sock, rest

    def _exit_code(self, exec_id: str) -> int | None:
        for _ in range(100):
            status = idempotent(lambda: self._client.api.exec_inspect(exec_id))
            if not status.get("Running"):
                code = status.get("ExitCode")
                return int(code) if code is not None else None
            time.sleep(0.01)
        return None


def _pump(
    sock: socket.socket,
    demux: FrameDemultiplexer,
    stdin: bytes | None,
    deadline: float,
    cancel: threading.Event | None,
) -> str | None:
    """Move bytes until the stream ends (None), the deadline passes ("timeout") or cancel is set."""
    sock.setblocking(False)
    pending = memoryview(stdin) if stdin is not None else None
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if pending is not None else 0))
        while True:
            if cancel is not None and cancel.is_set():
                return "cancel"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            wait = min(remaining, CANCEL_POLL_SECONDS) if cancel is not None else remaining
            for _key, mask in selector.select(wait):
                if mask & selectors.EVENT_WRITE and pending is not None:
                    try:
                        sent = sock.send(pending[:_READ_SIZE])
                    except BlockingIOError:
                        sent = 0
                    except OSError:  # the command stopped reading and exited: drop the rest
                        sent = len(pending)
                    pending = pending[sent:]
                    if not pending:
                        pending = None
                        _close_write(sock)
                        selector.modify(sock, selectors.EVENT_READ)
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(_READ_SIZE)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return None
                    if not data:
                        return None
                    demux.feed(data)


def _close_write(sock: socket.socket) -> None:
    """End of stdin: half-close so the daemon closes the command's stdin."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _read_error_body(sock: socket.socket, head: bytes, rest: bytes) -> str:
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    body = bytearray(rest)
    sock.settimeout(5)
    while len(body) < length:
        chunk = sock.recv(_READ_SIZE)
        if not chunk:
            break
        body += chunk
    try:
        return str(json.loads(bytes(body))["message"])
    except (ValueError, KeyError, TypeError):
        return bytes(body).decode(errors="replace").strip() or head.decode(errors="replace")
