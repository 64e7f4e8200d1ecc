"""Docker's exec API: the exec transport, and the stream the agent channel gets from an exec.

The one small interface between a :class:`DockerSession` and the container is
:class:`~adk_sandbox.executor.channel.transport.CommandTransport` (run a prepared command with a deadline,
feed its output to the shared capture, kill its whole tree). :class:`DockerExecTransport` implements it with
Docker's exec API, one exec per command; the agent channel
(:class:`~adk_sandbox.executor.channel.agent_transport.AgentTransport`, the default) replaces it without
touching the session, over the stream of **one** exec that :meth:`DockerExecTransport.open_agent_stream`
opens (:class:`DockerAgentStream`: stdin raw one way, Docker's multiplexed stdout and stderr the other,
split by :class:`DockerStreamSplitter`).

Process trees (Docker's exec API does not kill them: killing the client leaves the process running): every
command runs under the supervisor of :mod:`adk_sandbox.executor.channel.supervisor`, which kills the
command's descendants when it ends, whatever they did to hide, and never touches another command's
processes. On a timeout or a cancel, or when an exception interrupts the caller's thread while the output is
read, a second exec (the *killer*) kills that one command's tree. When the exec ends without its supervisor
finishing normally (status 137: the supervisor itself was SIGKILLed, or no status at all), the killer runs
as an orphan sweep.

Every call to the daemon made for a command is bounded by the command's deadline plus
:data:`DAEMON_GRACE_SECONDS`: the transport speaks HTTP to the daemon's Unix socket itself, with a socket
timeout per call, instead of docker-py (whose read timeout is a fixed minute per call). A daemon that stops
answering therefore costs a caller at most that grace beyond the timeout; what the killer could not
confirm is killed first thing before the container's next command.
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
from typing import Any, ClassVar, Literal

import docker

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backends.docker._daemon import map_docker_error
from adk_sandbox.executor.backends.docker.engine import Engine
from adk_sandbox.executor.channel.frames import ProtocolError
from adk_sandbox.executor.channel.streams import SocketStream
from adk_sandbox.executor.channel.supervisor import (
    killer_argv,
    parse_survey,
    supervisor_argv,
    survey_argv,
)
from adk_sandbox.executor.channel.transport import (
    CANCEL_POLL_SECONDS,
    KILL_ON_ERROR_SECONDS,
    CommandOutcome,
    ContainerGoneError,
    PreparedCommand,
)
from adk_sandbox.executor.errors import BackendUnavailableError, SandboxFailedError
from adk_sandbox.executor.types import Stream

__all__ = [
    "EXEC_NO_BACKGROUND",
    "DaemonSocket",
    "DaemonTimeoutError",
    "DockerAgentStream",
    "DockerExecTransport",
    "DockerStreamSplitter",
    "FrameDemultiplexer",
]

log = logging.getLogger(__name__)

#: After the kill, how long the remaining output may take to drain before the stream is closed.
DRAIN_AFTER_KILL_SECONDS = 2.0
#: Every daemon call made for a command must be answered by the command's deadline plus this.
DAEMON_GRACE_SECONDS = 5.0
#: How often the killer is tried when it cannot start (a fork bomb filling the pids limit).
KILL_ATTEMPTS = 5
_READ_SIZE = 65536
# Exit statuses of an exec whose program could not be started (no room for a process, or no program).
_NOT_STARTED = (126, 127)
# 128 + SIGKILL: the supervisor may have been killed by its command; its orphans went to PID 1.
_KILLED = 137

_KillResult = Literal["done", "no_room", "no_answer"]


class DaemonTimeoutError(SandboxFailedError):
    """The Docker daemon did not answer a call in time (by the command's deadline plus the grace)."""


class DockerStreamSplitter:
    """Splits Docker's multiplexed attach stream (8-byte headers: stream, 0, 0, 0, big-endian size).

    The one parser of that framing: the exec transport feeds its pieces to the output capture
    (:class:`FrameDemultiplexer`), the agent channel's stream (:class:`DockerAgentStream`) to the agent's
    frame decoder.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._stream = 0
        self._remaining = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Consume bytes as they arrive; the (stream number, payload) pieces they complete."""
        out: list[tuple[int, bytes]] = []
        view = memoryview(data)
        while view:
            if self._remaining:
                part = bytes(view[: self._remaining])
                self._remaining -= len(part)
                view = view[len(part) :]
                out.append((self._stream, part))
                continue
            need = 8 - len(self._header)
            self._header += view[:need]
            view = view[need:]
            if len(self._header) == 8:
                self._stream, self._remaining = struct.unpack(">BxxxL", self._header)
                self._header.clear()
        return out


class DockerAgentStream(SocketStream):
    """The agent channel's stream over a hijacked exec connection (an :class:`AgentStream`).

    What the agent writes arrives in Docker's attach framing, split here into stdout and stderr pieces;
    ``early`` is what the connection's upgrade already read.
    """

    _STREAMS: ClassVar[dict[int, Stream]] = {1: "stdout", 2: "stderr"}

    def __init__(self, sock: socket.socket, early: bytes) -> None:
        super().__init__(sock)
        self._early = early
        self._splitter = DockerStreamSplitter()
        self._broken: ProtocolError | None = None

    def read(self) -> list[tuple[Stream, bytes]] | None:
        """See :meth:`AgentStream.read <adk_sandbox.executor.channel.streams.AgentStream.read>`."""
        if self._broken is not None:
            raise self._broken
        if self._early:
            data, self._early = self._early, b""
        else:
            while True:
                try:
                    data = self.sock.recv(1 << 20)
                    break
                except TimeoutError:
                    continue  # a timeout someone set on the socket, not a broken stream: idle is fine
        if not data:
            return None
        pieces: list[tuple[Stream, bytes]] = []
        for number, piece in self._splitter.feed(data):
            stream = self._STREAMS.get(number)
            if stream is None:
                self._broken = ProtocolError(f"unexpected Docker stream {number}")
                if not pieces:
                    raise self._broken
                return pieces  # what came before it first; the next read raises
            pieces.append((stream, piece))
        return pieces


class FrameDemultiplexer:
    """Feeds a Docker attach stream's stdout and stderr pieces to an output capture."""

    _STREAMS: ClassVar[dict[int, Stream]] = {1: "stdout", 2: "stderr"}

    def __init__(self, capture: OutputCapture) -> None:
        self._capture = capture
        self._splitter = DockerStreamSplitter()

    def feed(self, data: bytes) -> None:
        """Consume bytes as they arrive."""
        for kind, part in self._splitter.feed(data):
            stream = self._STREAMS.get(kind)  # 0 (stdin echo) is not expected; dropped
            if stream is not None:
                self._capture.feed(stream, part)


class DaemonSocket:
    """Minimal HTTP/1.1 to the engine's API, each call bounded by an absolute deadline.

    One connection per call (``Connection: close``: a local connect costs microseconds, a TLS handshake to
    a remote engine a few milliseconds), so a call that times out leaves nothing half-read behind.
    Connections are made by :meth:`Engine.dial <executor.backends.docker.engine.Engine.dial>`.
    """

    def __init__(self, engine: Engine | str, api_version: str) -> None:
        self._engine = engine if isinstance(engine, Engine) else Engine(host=f"unix://{engine}")
        self._prefix = f"/v{api_version}"

    def request(self, method: str, path: str, body: object, until: float) -> tuple[int, Any]:
        """Send one request; the status and the decoded JSON body (None when empty or not JSON)."""
        sock = self._send(method, path, body, until, upgrade=False)
        try:
            data = bytearray()
            while chunk := _recv(sock, until):
                data += chunk
        finally:
            sock.close()
        head, sep, payload = bytes(data).partition(b"\r\n\r\n")
        if not sep:
            raise SandboxFailedError("the Docker daemon closed the connection before answering")
        status, headers = _parse_head(head)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            payload = _dechunk(payload)
        try:
            return status, json.loads(payload) if payload.strip() else None
        except ValueError:
            return status, {"message": payload.decode(errors="replace").strip()}

    def upgrade(self, path: str, body: object, until: float) -> tuple[socket.socket, int, bytes, bytes]:
        """Send a request that hijacks the connection; the socket, status, head and bytes after it.

        docker-py's socket mode hands out the socket behind a buffered HTTP reader, which may already hold
        the first output bytes; speaking the two-message HTTP upgrade directly avoids losing them.
        """
        sock = self._send("POST", path, body, until, upgrade=True)
        try:
            received = bytearray()
            while b"\r\n\r\n" not in received:
                chunk = _recv(sock, until)
                if not chunk:
                    raise SandboxFailedError("the Docker daemon closed the exec connection before answering")
                received += chunk
        except BaseException:
            sock.close()
            raise
        head, _, rest = bytes(received).partition(b"\r\n\r\n")
        status, _ = _parse_head(head)
        return sock, status, head, rest

    def _send(self, method: str, path: str, body: object, until: float, *, upgrade: bool) -> socket.socket:
        payload = json.dumps(body).encode() if body is not None else b""
        connection = "Upgrade\r\nUpgrade: tcp" if upgrade else "close"
        request = (
            f"{method} {self._prefix}{path} HTTP/1.1\r\nHost: docker\r\nConnection: {connection}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        try:
            sock = self._engine.dial(_remaining(until), stream=upgrade)
        except (ConnectionError, FileNotFoundError) as exc:
            raise map_docker_error(exc) from exc
        except TimeoutError as exc:
            raise _timeout() from exc
        except OSError as exc:  # a name that does not resolve, a network that is unreachable
            raise BackendUnavailableError(f"cannot connect to the Docker engine: {exc}") from exc
        try:
            sock.settimeout(_remaining(until))
            sock.sendall(request)
        except TimeoutError as exc:
            sock.close()
            raise _timeout() from exc
        except OSError as exc:
            sock.close()
            raise SandboxFailedError(f"lost the connection to the Docker daemon: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return sock


def _remaining(until: float) -> float:
    left = until - time.monotonic()
    if left <= 0:
        raise _timeout()
    return left


def _timeout() -> DaemonTimeoutError:
    return DaemonTimeoutError(
        f"the Docker daemon did not answer within {DAEMON_GRACE_SECONDS:g} s of the command's deadline "
        "(is it overloaded or stopped?)"
    )


def _recv(sock: socket.socket, until: float) -> bytes:
    try:
        sock.settimeout(_remaining(until))
        return sock.recv(_READ_SIZE)
    except TimeoutError as exc:
        raise _timeout() from exc
    except OSError as exc:
        raise SandboxFailedError(f"lost the connection to the Docker daemon: {exc}") from exc


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise SandboxFailedError(f"the Docker daemon sent no HTTP answer: {lines[0]!r}") from exc
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _dechunk(data: bytes) -> bytes:
    body = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        body += data[:size]
        data = data[size + 2 :]
    return bytes(body)


def _message(body: Any) -> str:
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(body)


#: Why a session on the exec transport refuses ``background=True`` (DockerSession.execute): the
#: supervisor is the exec's own process and kills everything at its exit; survivors would be orphans the
#: sweeps kill, so nothing could keep them.
EXEC_NO_BACKGROUND = (
    "background processes need the agent channel, which keeps them until the session closes; this session "
    "uses the exec transport, where every process of a command dies with it (create the backend with "
    "DockerBackend(transport='agent'), the default, or omit background)"
)


class DockerExecTransport:
    """:class:`CommandTransport` over Docker's exec API, streaming straight from the daemon's socket."""

    channel: ClassVar[str] = "exec"

    def __init__(
        self,
        client: docker.DockerClient,
        container_id: str,
        engine: Engine | str,
        *,
        setid_allowed: bool = False,
    ) -> None:
        """``engine``: the client's engine (an :class:`Engine`, or the path of a local engine's socket).

        ``setid_allowed`` runs every command's supervisor in the mode without the set-id filter (for a
        sandbox whose workspace never reaches the host as a bind mount); by default each command gets it.
        The supervisor has no HELLO: the start-up probe (``verify_from_inside(setid_allowed=...)``) is what
        proves the choice. It does not concern :meth:`open_agent_stream`, whose argv the agent channel
        makes (``AgentTransport(setid_allowed=...)``).
        """
        self._container_id = container_id
        self._setid_allowed = setid_allowed
        self._daemon = DaemonSocket(engine, client.api.api_version)
        self._lock = threading.Lock()
        self._survey: tuple[bool, str] | None = None
        # (marker, user) of commands whose trees may still be alive: the killer could not confirm (the
        # daemon did not answer); they are killed before the next command of this container starts, as
        # the user they ran as (a kill as another user would do nothing, with per-call users).
        self._pending: set[tuple[str, str]] = set()

    @property
    def setid_allowed(self) -> bool:
        """True when commands run without the set-id filter (asked for at construction)."""
        return self._setid_allowed

    def close(self) -> None:
        """Nothing is held between commands (each is its own exec)."""

    def open_agent_stream(self, argv: list[str], user: str, until: float) -> DockerAgentStream:
        """Start ``argv`` as ``user`` in the container with stdin attached: the agent channel's opener.

        An :data:`~adk_sandbox.executor.channel.streams.AgentStreamOpener`: the exec is created and
        started over a raw hijacked connection (as every exec of this transport), in ``/``.
        """
        exec_id = self._create_exec(argv, user, "/", True, until)
        sock, early = self._start_exec(exec_id, until)
        return DockerAgentStream(sock, early)

    def attach_keeper(self, until: float) -> DockerAgentStream:
        """A stream to the container's own stdin and output: its keeper's (docs/pause.md).

        An attach over a raw hijacked connection. The container keeps its stdin open between attaches
        (``StdinOnce`` false), so closing this stream does not end the keeper nor its agent.
        """
        path = f"/containers/{self._container_id}/attach?stream=1&stdin=1&stdout=1&stderr=1"
        sock, status, head, rest = self._daemon.upgrade(path, None, until)
        if status not in (101, 200):
            try:
                message = _read_error_body(sock, head, rest, until)
            finally:
                sock.close()
            raise SandboxFailedError(
                f"the Docker daemon refused to attach to the container ({status}): {message}"
            )
        return DockerAgentStream(sock, rest)

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        """See :meth:`CommandTransport.run`."""
        until = deadline + DAEMON_GRACE_SECONDS
        protected = self._prepare(command.user, until)
        argv = supervisor_argv(
            command.marker,
            protected,
            max(deadline - time.monotonic(), 0.0),
            command.env,
            command.argv,
            setid_allowed=self._setid_allowed,
        )
        exec_id = self._create_exec(argv, command.user, command.workdir, command.stdin is not None, until)
        try:
            sock, early = self._start_exec(exec_id, until)
        except ContainerGoneError:
            raise
        except BaseException:
            self._remember(command)  # it may have started after all
            raise
        stopped: str | None = None
        killed: _KillResult = "done"
        try:
            demux = FrameDemultiplexer(capture)
            demux.feed(early)
            stopped = _pump(sock, demux, command.stdin, deadline, cancel)
            if stopped is not None:
                killed = self._kill(command.marker, command.user, until)
                if killed == "done":
                    drain = min(time.monotonic() + DRAIN_AFTER_KILL_SECONDS, until)
                    _pump(sock, demux, None, drain, None)
        except BaseException:
            # The caller's thread was interrupted while reading (a failing on_output callback, a
            # KeyboardInterrupt): the command must not keep running behind the exception.
            sock.close()
            killed = self._kill(command.marker, command.user, time.monotonic() + KILL_ON_ERROR_SECONDS)
            if killed != "done":
                self._remember(command)
            raise
        finally:
            sock.close()
        if stopped is not None:
            if killed == "no_answer":
                self._remember(command)
            return CommandOutcome(
                exit_code=None,
                timed_out=stopped == "timeout",
                cancelled=stopped == "cancel",
                kill_failed=killed == "no_room",
            )
        try:
            exit_code = self._exit_code(exec_id, until)
        except BaseException:
            self._remember(command)
            raise
        if exit_code is None or exit_code == _KILLED:
            # The supervisor itself may have been SIGKILLed by its command: sweep its orphans.
            killed = self._kill(command.marker, command.user, until)
            if killed == "no_answer":
                self._remember(command)
            return CommandOutcome(exit_code=exit_code, kill_failed=killed == "no_room")
        return CommandOutcome(exit_code=exit_code)

    # -- the supervisor's helpers: survey, killer ----------------------------------------------------
    def _prepare(self, user: str, until: float) -> str:
        """Survey the container once; kill what earlier commands may have left. The protected list."""
        with self._lock:
            if self._survey is None:
                code, output = self._small_exec(survey_argv(), user, until)
                survey = parse_survey(output)
                if survey is None:
                    raise SandboxFailedError(
                        "the session container cannot run the command supervisor (exit status "
                        f"{code}: {output.strip()[:500]!r}); its image must provide python3 on PATH"
                    )
                self._survey = survey
            pending = sorted(self._pending)
        for marker, owner in pending:
            killed = self._kill(marker, owner, until)
            if killed == "no_room":
                raise ContainerGoneError("the processes of an earlier command could not be killed in it")
            if killed == "no_answer":
                raise _timeout()
            with self._lock:
                self._pending.discard((marker, owner))
        return self._survey[1]

    def _remember(self, command: PreparedCommand) -> None:
        with self._lock:
            self._pending.add((command.marker, command.user))

    def _kill(self, marker: str, user: str, until: float) -> _KillResult:
        """Kill the tree of the command run with ``marker`` and sweep orphans, from inside the container."""
        assert self._survey is not None  # noqa: S101 - run() surveys before any command starts
        strict, protected = self._survey
        argv = killer_argv(marker, protected, strict=strict)
        for attempt in range(KILL_ATTEMPTS):
            try:
                code, output = self._small_exec(argv, user, until)
            except ContainerGoneError:
                return "done"  # no container left, so no process of it either
            except DaemonTimeoutError:
                return "no_answer"
            except SandboxFailedError as exc:
                log.info("killer could not start (attempt %d): %s", attempt + 1, exc)
            else:
                if code not in _NOT_STARTED:
                    return "done"
                log.info("killer could not start (attempt %d): %s", attempt + 1, output.strip())
            time.sleep(min(0.05 * (attempt + 1), max(until - time.monotonic(), 0)))
        return "no_room"

    def _small_exec(self, argv: list[str], user: str, until: float) -> tuple[int | None, str]:
        """Run a helper exec to its end; its exit status and its output (both streams)."""
        exec_id = self._create_exec(argv, user, "/", False, until)
        sock, early = self._start_exec(exec_id, until)
        capture = OutputCapture(65536)
        try:
            demux = FrameDemultiplexer(capture)
            demux.feed(early)
            if _pump(sock, demux, None, until, None) is not None:
                raise _timeout()
        finally:
            sock.close()
        streams = capture.finish()
        return self._exit_code(exec_id, until), streams["stdout"].text + streams["stderr"].text

    # -- exec API ------------------------------------------------------------------------------------
    def _create_exec(self, argv: list[str], user: str, workdir: str, attach_stdin: bool, until: float) -> str:
        config = {
            "User": user,
            "Privileged": False,
            "Tty": False,
            "AttachStdin": attach_stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Cmd": argv,
            "WorkingDir": workdir,
        }
        status, body = self._daemon.request("POST", f"/containers/{self._container_id}/exec", config, until)
        # 404: the container vanished; 409: it is not running. Either way nothing started.
        if status in (404, 409):
            raise ContainerGoneError(f"the sandbox container cannot run commands: {_message(body)}")
        if status != 201 or not isinstance(body, dict) or "Id" not in body:
            raise SandboxFailedError(f"the Docker daemon refused a request ({status}): {_message(body)}")
        return str(body["Id"])

    def _start_exec(self, exec_id: str, until: float) -> tuple[socket.socket, bytes]:
        """Start the exec over a raw hijacked connection; return the socket and any bytes already read."""
        body = {"Detach": False, "Tty": False}
        sock, status, head, rest = self._daemon.upgrade(f"/exec/{exec_id}/start", body, until)
        if status not in (101, 200):
            try:
                message = _read_error_body(sock, head, rest, until)
            finally:
                sock.close()
            if status in (404, 409):
                raise ContainerGoneError(f"the sandbox container cannot run commands: {message}")
            raise SandboxFailedError(f"the Docker daemon refused to start a command ({status}): {message}")
        return sock, rest

    def _exit_code(self, exec_id: str, until: float) -> int | None:
        """The exec's exit status once the daemon marks it ended (None if it does not within 5 s)."""
        give_up = min(until, time.monotonic() + 5.0)
        while True:
            try:
                status, body = self._daemon.request("GET", f"/exec/{exec_id}/json", None, until)
            except BackendUnavailableError as exc:
                # The daemon went away (stopped or restarting) after the exec started: the sandbox failed.
                raise SandboxFailedError(
                    f"lost the Docker daemon while the command ran ({exc}); the command's end is unknown "
                    "(it is not re-run)"
                ) from exc
            if status == 200 and isinstance(body, dict):
                if not body.get("Running"):
                    code = body.get("ExitCode")
                    return int(code) if code is not None else None
            elif status == 404:
                raise SandboxFailedError(f"the sandbox container is gone: {_message(body)}")
            elif status < 500:  # a 5xx is transient: asked again
                raise SandboxFailedError(f"the Docker daemon refused a request ({status}): {_message(body)}")
            if time.monotonic() > give_up:
                return None
            time.sleep(0.005)


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


def _read_error_body(sock: socket.socket, head: bytes, rest: bytes, until: float) -> str:
    _, headers = _parse_head(head)
    length = int(headers.get("content-length") or 0)
    body = bytearray(rest)
    with contextlib.suppress(SandboxFailedError):
        while len(body) < length and (chunk := _recv(sock, min(until, time.monotonic() + 5))):
            body += chunk
    try:
        return str(json.loads(bytes(body))["message"])
    except (ValueError, KeyError, TypeError):
        return bytes(body).decode(errors="replace").strip() or head.decode(errors="replace")
