"""The host side of the agent channel: :class:`AgentTransport`, a :class:`CommandTransport` over one exec.

The agent (:mod:`._agent`) is started on first use through **one** Docker exec with stdin attached, over
a raw hijacked connection to the daemon's socket (as :class:`DockerExecTransport` starts its execs). One
reader thread splits Docker's stream framing, then decodes the agent's frames (:mod:`._frames`) into
per-channel queues; writes are serialised by a lock and bounded by a socket timeout.

The agent runs as the same uid as the commands, so a command can kill, stop or impersonate it. The host
never depends on its honesty: every frame is checked (:class:`FrameDecoder`), every wait is bounded by
the command's deadline plus :data:`AGENT_GRACE_SECONDS`, and anything unexpected — a protocol error, the
stream ending, no answer in time — marks the agent broken: its in-flight commands fail with
:class:`SandboxFailedError` (never re-run), and the next command starts a new agent (logged, counted by
``on_restart``), which first kills what the old one left in the container.

Commands run as the agent's user, so there is one agent per user (``"uid:gid"``), kept in a dict:
alternating users in one session starts each user's agent once and keeps them all running (a user
switch is not a restart). Since an agent, when it starts, kills any other agent it is allowed to signal
(the backstop for one the host gave up), two users with the same uid and different gids cannot have
agents at the same time: the newer replaces the older (logged, not counted as a restart).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker

from executor._output import OutputCapture
from executor.backends.docker import _agent
from executor.backends.docker._agent import agent_argv
from executor.backends.docker._frames import (
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
)
from executor.backends.docker._transport import (
    CANCEL_POLL_SECONDS,
    KILL_ON_ERROR_SECONDS,
    CommandOutcome,
    DockerExecTransport,
    DockerStreamSplitter,
    PreparedCommand,
)
from executor.errors import SandboxFailedError
from executor.types import Stream

__all__ = ["AGENT_GRACE_SECONDS", "AgentTransport"]

log = logging.getLogger(__name__)

#: Beyond its deadline, how long a command may take to be confirmed dead by the agent.
AGENT_GRACE_SECONDS = 5.0
#: How long the agent may take to start and say HELLO.
AGENT_START_SECONDS = 30.0
#: Bytes of stdin per STDIN frame.
STDIN_CHUNK = 64 * 1024
#: Diagnostics the agent writes to its stderr that are kept for error messages.
_STDERR_KEPT = 4096
#: Frames queued for one command before the reader waits for the caller to catch up.
_QUEUE_FRAMES = 256
_SEND_SECONDS = 10.0

_Event = tuple[str, Any]


@dataclass
class _Channel:
    events: queue.Queue[_Event]
    open: bool = True


class _Agent:
    """One running agent: its socket, reader thread and channels."""

    def __init__(self, sock: socket.socket, early: bytes, user: str) -> None:
        # The reader waits on this socket for as long as the agent lives (idle included): no timeout on
        # it. Writes are bounded by select() instead of a socket timeout, which the reader would share.
        sock.settimeout(None)
        self.sock = sock
        self.user = user
        self.hello: dict[str, Any] | None = None
        self.broken: str | None = None
        self._hello_seen = threading.Event()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._channels: dict[int, _Channel] = {}
        self._next_channel = 1
        self._stderr = bytearray()
        self._docker = DockerStreamSplitter()
        self._decoder = FrameDecoder()
        self._thread = threading.Thread(
            target=self._read, args=(early,), name="adk-sandbox-agent", daemon=True
        )
        self._thread.start()

    # -- reading -------------------------------------------------------------------------------------
    def _read(self, early: bytes) -> None:
        try:
            if early:
                self._dispatch(early)
            while self.broken is None:
                try:
                    data = self.sock.recv(1 << 20)
                except OSError as exc:
                    self._fail(f"the connection to the in-sandbox agent broke: {exc}")
                    return
                if not data:
                    self._fail("the in-sandbox agent ended" + self._diagnostics())
                    return
                self._dispatch(data)
        except ProtocolError as exc:
            self._fail(f"the in-sandbox agent broke protocol version 1: {exc}")
        except BaseException as exc:  # never let the reader die silently
            self._fail(f"the in-sandbox agent's reader failed: {exc!r}")

    def _dispatch(self, data: bytes) -> None:
        for stream, piece in self._docker.feed(data):
            if stream == 2:
                room = _STDERR_KEPT - len(self._stderr)
                if room > 0:
                    self._stderr += piece[:room]
                continue
            if stream != 1:
                raise ProtocolError(f"unexpected Docker stream {stream}")
            for frame in self._decoder.feed(piece):
                self._deliver(frame)

    def _deliver(self, frame: Frame) -> None:
        if frame.type == FrameType.HELLO:
            self.hello = frame.body
            self._hello_seen.set()
            return
        if frame.type == FrameType.PONG:
            return
        with self._lock:
            if frame.channel >= self._next_channel:
                raise ProtocolError(f"frame for channel {frame.channel}, which was never opened")
            channel = self._channels.get(frame.channel)
        if channel is None:
            return  # a channel the host already gave up: its late frames are dropped
        if frame.type in (FrameType.STDOUT, FrameType.STDERR):
            event: _Event = ("stdout" if frame.type == FrameType.STDOUT else "stderr", frame.data)
        elif frame.type == FrameType.EXIT:
            event = ("exit", frame.body)
        else:
            event = ("error", (frame.body or {}).get("message", ""))
        while channel.open and self.broken is None:
            try:
                channel.events.put(event, timeout=0.1)
                return
            except queue.Full:
                continue

    def _diagnostics(self) -> str:
        text = bytes(self._stderr).decode(errors="replace").strip()
        return f": {text[-1000:]}" if text else ""

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = why
            channels = list(self._channels.values())
        self._hello_seen.set()
        for channel in channels:
            with contextlib.suppress(queue.Full):
                channel.events.put_nowait(("broken", why))
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self, why: str = "closed") -> None:
        """Give the agent up: close the stream (the agent kills its commands when its stdin ends)."""
        self._fail(why)
        self.sock.close()

    def wait_hello(self, until: float) -> dict[str, Any]:
        self._hello_seen.wait(max(until - time.monotonic(), 0))
        if self.hello is not None:
            return self.hello
        if self.broken is not None:
            raise SandboxFailedError(
                f"the in-sandbox agent could not start ({self.broken}); the session image must provide "
                "python3 on PATH"
            )
        self.close("no HELLO")
        raise SandboxFailedError("the in-sandbox agent did not answer when it started")

    # -- channels and writing ------------------------------------------------------------------------
    def open_channel(self) -> tuple[int, _Channel]:
        with self._lock:
            if self.broken is not None:
                raise SandboxFailedError(self.broken)
            number = self._next_channel
            self._next_channel += 1
            channel = _Channel(queue.Queue(_QUEUE_FRAMES))
            self._channels[number] = channel
        return number, channel

    def close_channel(self, number: int) -> None:
        with self._lock:
            channel = self._channels.pop(number, None)
        if channel is not None:
            channel.open = False

    def send(self, data: bytes, until: float) -> None:
        """Write frames; a stream that does not take them in time breaks the agent."""
        if not self._write_lock.acquire(timeout=max(until - time.monotonic(), 0.001)):
            raise SandboxFailedError("the in-sandbox agent did not answer (its stream is blocked)")
        try:
            if self.broken is not None:
                raise SandboxFailedError(self.broken)
            _send_all(self.sock, data, until)
        except OSError as exc:
            self._fail(f"could not write to the in-sandbox agent: {exc}")
            raise SandboxFailedError(
                f"the in-sandbox agent did not answer (writing to it failed: {exc})"
            ) from exc
        finally:
            self._write_lock.release()


def _send_all(sock: socket.socket, data: bytes, until: float) -> None:
    """Write all of ``data`` by ``until`` (else ``TimeoutError``), leaving the socket's own timeout alone."""
    view = memoryview(data)
    while view:
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        _, writable, _ = select.select([], [sock], [], left)
        if writable:
            try:
                view = view[sock.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                continue


class AgentTransport:
    """:class:`CommandTransport` over one long-lived agent per container (see the module docstring)."""

    channel = "agent"

    def __init__(
        self,
        client: docker.DockerClient,
        container_id: str,
        socket_path: str,
        *,
        on_restart: Callable[[str], None] | None = None,
        source: str | None = None,
    ) -> None:
        self._exec = DockerExecTransport(client, container_id, socket_path)
        self._lock = threading.Lock()
        self._agents: dict[str, _Agent] = {}
        self._last: _Agent | None = None
        self._protected: str | None = None
        self._started = 0
        self._on_restart = on_restart
        self._source = source

    @property
    def agent_pid(self) -> int | None:
        """The pid inside the container of the agent used last (None before the first command)."""
        agent = self._last
        return int(agent.hello["pid"]) if agent is not None and agent.hello else None

    @property
    def agent_pids(self) -> dict[str, int]:
        """The pid inside the container of each user's running agent, by ``"uid:gid"``."""
        with self._lock:
            agents = dict(self._agents)
        return {user: int(agent.hello["pid"]) for user, agent in agents.items() if agent.hello}

    @property
    def agents_started(self) -> int:
        """How many agents this transport has started (every user's, restarts included)."""
        return self._started

    def close(self) -> None:
        """Stop every agent (each kills its commands when its stdin ends)."""
        with self._lock:
            agents, self._agents, self._last = list(self._agents.values()), {}, None
        for agent in agents:
            agent.close()

    def _agent_for(self, user: str, until: float) -> _Agent:
        with self._lock:
            agent = self._agents.get(user)
            if agent is not None and agent.broken is None:
                self._last = agent
                return agent
            # Only the loss of this user's own agent is a restart; starting a new user's is not.
            replacing: str | None = None
            if agent is not None:
                replacing = agent.broken or "it broke"
                agent.close(replacing)
                del self._agents[user]
            uid = user.partition(":")[0]
            for other, same_uid in list(self._agents.items()):
                if other.partition(":")[0] == uid:  # the new agent would kill it: give it up first
                    log.info(
                        "in-sandbox agent of %s given up: commands of uid %s now run as %s", other, uid, user
                    )
                    same_uid.close(f"commands of uid {uid} now run as {user}")
                    del self._agents[other]
            start_by = min(until, time.monotonic() + AGENT_START_SECONDS)
            argv = agent_argv(self._protected, self._source or _agent.AGENT_SOURCE)
            exec_id = self._exec._create_exec(argv, user, "/", True, start_by)
            sock, early = self._exec._start_exec(exec_id, start_by)
            agent = _Agent(sock, early, user)
            try:
                hello = agent.wait_hello(start_by)
            except BaseException:
                agent.close()
                raise
            if self._protected is None and isinstance(hello.get("protected"), str):
                self._protected = str(hello["protected"])
            self._agents[user] = agent
            self._last = agent
            self._started += 1
            if replacing is not None:
                log.warning("in-sandbox agent replaced by a new one: %s", replacing)
                if self._on_restart is not None:
                    self._on_restart(replacing)
            return agent

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        """See :meth:`CommandTransport.run`."""
        until = deadline + AGENT_GRACE_SECONDS
        agent = self._agent_for(command.user, until)
        number, channel = agent.open_channel()
        try:
            return self._run(agent, number, channel, command, capture, deadline, cancel)
        finally:
            agent.close_channel(number)

    def _run(  # noqa: PLR0912, PLR0917 - one loop: every way a command's wait can end
        self,
        agent: _Agent,
        number: int,
        channel: _Channel,
        command: PreparedCommand,
        capture: OutputCapture,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        run = {
            "argv": list(command.argv),
            "env": command.env,
            "cwd": command.workdir,
            "timeout": max(deadline - time.monotonic(), 0.0),
            "max_output_bytes": capture.max_bytes,
            "stdin": command.stdin is not None,
        }
        frames = [encode(FrameType.RUN, number, run)]
        if command.stdin is not None:
            data = command.stdin
            frames += [encode(FrameType.STDIN, number, data[i : i + STDIN_CHUNK])
                       for i in range(0, len(data), STDIN_CHUNK)]  # fmt: skip
            frames.append(encode(FrameType.STDIN, number))
        payload = b"".join(frames)
        agent.send(payload, min(deadline, time.monotonic() + _SEND_SECONDS) + AGENT_GRACE_SECONDS)
        stopped: str | None = None
        give_up = deadline + AGENT_GRACE_SECONDS
        try:
            while True:
                now = time.monotonic()
                if stopped is None and cancel is not None and cancel.is_set():
                    stopped = "cancel"
                if stopped is None and now >= deadline:
                    stopped = "timeout"
                if stopped is not None and give_up > now + AGENT_GRACE_SECONDS:
                    give_up = now + AGENT_GRACE_SECONDS
                    agent.send(encode(FrameType.KILL, number), give_up)
                if now >= give_up:
                    self._abandon(agent, "it did not confirm the end of a command in time")
                    raise SandboxFailedError(
                        "the in-sandbox agent did not answer within "
                        f"{AGENT_GRACE_SECONDS:g} s of the command's deadline; it was replaced"
                    )
                wait = give_up - now
                if stopped is None:
                    wait = min(wait, deadline - now)
                    if cancel is not None:
                        wait = min(wait, CANCEL_POLL_SECONDS)
                try:
                    kind, value = channel.events.get(timeout=max(wait, 0.001))
                except queue.Empty:
                    if agent.broken is not None and channel.events.empty():
                        raise SandboxFailedError(
                            f"{agent.broken}; the command's end is unknown (it is not re-run)"
                        ) from None
                    continue
                if kind in ("stdout", "stderr"):
                    stream: Stream = "stdout" if kind == "stdout" else "stderr"
                    capture.feed(stream, value)
                elif kind == "exit":
                    return self._outcome(value, stopped, capture)
                elif kind == "error":
                    raise SandboxFailedError(f"the in-sandbox agent could not run the command: {value}")
                else:  # broken
                    raise SandboxFailedError(f"{value}; the command's end is unknown (it is not re-run)")
        except BaseException as exc:
            if isinstance(exc, SandboxFailedError) or stopped is not None:
                raise
            # The caller's thread was interrupted while reading (a failing on_output callback, a
            # KeyboardInterrupt): the command must not keep running behind the exception.
            self._kill_after_error(agent, number, channel)
            raise

    def _kill_after_error(self, agent: _Agent, number: int, channel: _Channel) -> None:
        until = time.monotonic() + KILL_ON_ERROR_SECONDS
        try:
            agent.send(encode(FrameType.KILL, number), until)
            while time.monotonic() < until:
                try:
                    kind, _ = channel.events.get(timeout=max(until - time.monotonic(), 0.001))
                except queue.Empty:
                    break
                if kind in ("exit", "error", "broken"):
                    return
        except SandboxFailedError:
            pass
        self._abandon(agent, "it did not confirm a kill in time")

    def _abandon(self, agent: _Agent, why: str) -> None:
        log.warning("in-sandbox agent given up: %s", why)
        agent.close(f"the in-sandbox agent was given up: {why}")

    @staticmethod
    def _outcome(body: dict[str, Any], stopped: str | None, capture: OutputCapture) -> CommandOutcome:
        for stream in ("stdout", "stderr"):
            dropped = body[f"{stream}_dropped"]
            if dropped:
                capture.note_dropped("stdout" if stream == "stdout" else "stderr", int(dropped))
        timed_out = bool(body["timed_out"]) or stopped == "timeout"
        if timed_out or stopped == "cancel":
            return CommandOutcome(exit_code=None, timed_out=timed_out, cancelled=not timed_out)
        code, sig = body["exit_code"], body["signal"]
        if code is not None:
            return CommandOutcome(exit_code=int(code))
        return CommandOutcome(exit_code=128 + int(sig) if sig is not None else None)
