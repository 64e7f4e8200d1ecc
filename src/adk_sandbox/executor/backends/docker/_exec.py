"""Docker's exec API as the agent channel's way in: the stream of one exec, and the keeper's attach.

:class:`DockerExecs` opens the agent's stream (:meth:`DockerExecs.open_agent_stream`, read as a
:class:`DockerAgentStream` split by :class:`DockerStreamSplitter`) and a keeper's
(:meth:`DockerExecs.attach_keeper`); :class:`DaemonSocket` bounds every daemon call by a deadline.
Depth: docs/docker/agent-channel.md, "Transport and daemon".
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from typing import Any, ClassVar

import docker

from adk_sandbox.executor.backends.docker._daemon import map_docker_error
from adk_sandbox.executor.backends.docker.engine import Engine
from adk_sandbox.executor.channel.frames import ProtocolError
from adk_sandbox.executor.channel.streams import SocketStream
from adk_sandbox.executor.channel.transport import ContainerGoneError
from adk_sandbox.executor.errors import BackendUnavailableError, SandboxFailedError
from adk_sandbox.executor.types import Stream

__all__ = [
    "DaemonSocket",
    "DaemonTimeoutError",
    "DockerAgentStream",
    "DockerExecs",
    "DockerStreamSplitter",
]

_READ_SIZE = 65536


class DaemonTimeoutError(SandboxFailedError):
    """The Docker daemon did not answer a call by its deadline."""


class DockerStreamSplitter:
    """Splits Docker's multiplexed attach stream (8-byte headers: stream, 0, 0, 0, big-endian size).

    The one parser of that framing: the agent channel's stream (:class:`DockerAgentStream`) feeds its
    pieces to the agent's frame decoder.
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
    return DaemonTimeoutError("the Docker daemon did not answer in time (is it overloaded or stopped?)")


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


class DockerExecs:
    """Docker's exec and attach API for one container, over the daemon's socket (no per-call minute)."""

    def __init__(self, client: docker.DockerClient, container_id: str, engine: Engine | str) -> None:
        """``engine``: the client's engine (an :class:`Engine`, or the path of a local engine's socket)."""
        self._container_id = container_id
        self._daemon = DaemonSocket(engine, client.api.api_version)

    def open_agent_stream(self, argv: list[str], user: str, until: float) -> DockerAgentStream:
        """Start ``argv`` as ``user`` in the container with stdin attached: the agent channel's opener.

        An :data:`~adk_sandbox.executor.channel.streams.AgentStreamOpener`: the exec is created and
        started over a raw hijacked connection, in ``/``. The agent's argv (and so its set-id mode) is
        the agent channel's (``AgentTransport(setid_allowed=...)``).
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
