"""The host side of the agent channel: :class:`AgentTransport`, a :class:`CommandTransport` over one stream.

One agent per user, started on first use through one exec whose stream the engine opens
(:data:`AgentStreamOpener`, :mod:`.streams`); frames are checked, waits bounded by
:data:`AGENT_GRACE_SECONDS`, a broken agent replaced. Also :class:`DetachedAgent` and
:class:`FileOpCancelledError`. See docs/docker/agent-channel.md, section "The agent channel", and
docs/docker/sessions.md for users.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.channel.connections import ConnectionHandler, Connections, ConnectionStream
from adk_sandbox.executor.channel.frames import (
    CONNECTION_TYPES,
    DIAL_VERSION,
    PROXY_VERSION,
    PTY_VERSION,
    UNIX_VERSION,
    AgentEndedError,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
    validate_listen_address,
    validate_result_for,
)
from adk_sandbox.executor.channel.static_agent import AgentLaunch, StaticAgentUnavailableError, agent_launch
from adk_sandbox.executor.channel.streams import AgentStream, AgentStreamOpener, ResidentOpener
from adk_sandbox.executor.channel.transport import (
    CANCEL_POLL_SECONDS,
    KILL_ON_ERROR_SECONDS,
    CommandOutcome,
    PreparedCommand,
)
from adk_sandbox.executor.errors import (
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.types import Stream

__all__ = [
    "AGENT_GRACE_SECONDS",
    "AgentStreamOpener",
    "AgentTransport",
    "DetachedAgent",
    "FileOpCancelledError",
]

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
#: Bytes of a write's data sent under one hold of the write lock (a concurrent command's frames go between).
_SEND_SLICE = 4 * STDIN_CHUNK

_Event = tuple[str, Any]
_Live = TypeVar("_Live")


@dataclass
class _Channel:
    events: queue.Queue[_Event]
    open: bool = True


_ENDED = "the in-sandbox agent ended (killed in the container, or the container or the Docker engine stopped)"


@dataclass(frozen=True)
class DetachedAgent:
    """An agent let go of (:meth:`AgentTransport.detach`), to be served again over a new stream.

    Plain data, so a snapshot with processes can keep it beside the checkpoint holding the agent itself.
    """

    user: str
    """Whose agent it is (``"uid:gid"``)."""
    hello: dict[str, Any]
    """What it said when it started (no HELLO comes again)."""
    numbering: tuple[int, int, int]
    """Where its channel numbers were (see :meth:`_Agent.numbering`): they go on, never reused."""
    resident: bool
    """It is the container keeper's child."""


class _Agent:
    """One running agent: its stream, reader thread and channels."""

    def __init__(
        self,
        stream: AgentStream,
        user: str,
        hello: dict[str, Any] | None = None,
        *,
        numbering: tuple[int, int, int] | None = None,
        listeners: Mapping[int, ConnectionHandler] | None = None,
    ) -> None:
        """``hello``, ``numbering``, ``listeners``: for an agent served again (no HELLO comes; see reattach).

        All are in place before the reader starts, so no frame of the agent comes before them.
        """
        self.stream = stream
        self.user = user
        self.hello: dict[str, Any] | None = hello
        self.broken: str | None = None
        self._hello_seen = threading.Event()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._channels: dict[int, _Channel] = {}
        self._next_channel = 1
        #: PINGs in flight, by token: set when the PONG with that token comes back (or the agent breaks).
        self._pongs: dict[str, threading.Event] = {}
        self._stderr = bytearray()
        self._decoder = FrameDecoder(expect_hello=hello is None)
        #: The proxy endpoint's connections (``serve_connections``): their frames go there, not to channels.
        self.connections = Connections(self.send)
        if numbering is not None:
            self.continue_from(numbering)
        for number, handler in (listeners or {}).items():
            self.connections.add_listener(number, handler)
        self._thread = threading.Thread(target=self._read, name="adk-sandbox-agent", daemon=True)
        self._thread.start()

    # -- reading -------------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while self.broken is None:
                try:
                    pieces = self.stream.read()
                except OSError as exc:
                    self._fail(f"the connection to the in-sandbox agent broke: {exc}")
                    return
                if pieces is None:
                    self._fail(_ENDED + self._diagnostics())
                    return
                self._dispatch(pieces)
        except AgentEndedError:  # the keeper's word, or an agent's lie: given up either way
            self._fail(
                "the in-sandbox agent ended (its keeper says so), or broke protocol version 1 with byte "
                "0xff where a frame starts" + self._diagnostics()
            )
        except ProtocolError as exc:
            self._fail(f"the in-sandbox agent broke protocol version 1: {exc}")
        except BaseException as exc:  # never let the reader die silently
            self._fail(f"the in-sandbox agent's reader failed: {exc!r}")

    def _dispatch(self, pieces: list[tuple[Stream, bytes]]) -> None:
        for stream, piece in pieces:
            if stream == "stderr":
                room = _STDERR_KEPT - len(self._stderr)
                if room > 0:
                    self._stderr += piece[:room]
                continue
            for frame in self._decoder.feed(piece):
                self._deliver(frame)

    def _deliver(self, frame: Frame) -> None:
        if frame.type == FrameType.HELLO:
            self.hello = frame.body
            self._hello_seen.set()
            return
        if frame.type == FrameType.PONG:
            token = (frame.body or {}).get("ping")
            with self._lock:
                waiter = self._pongs.pop(token, None) if isinstance(token, str) else None
            if waiter is not None:
                waiter.set()
            return
        if frame.type in CONNECTION_TYPES:
            self.connections.deliver(frame)
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
        elif frame.type == FrameType.RESULT:
            event = ("result", frame.body)
        else:
            body = frame.body or {}
            # "refused": the agent would not start the command in its present state (nothing ran).
            event = ("refused" if body.get("refused") is True else "error", body.get("message", ""))
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
            pongs, self._pongs = list(self._pongs.values()), {}
        self._hello_seen.set()
        self.connections.fail_all(why)
        for waiter in pongs:
            waiter.set()
        for channel in channels:
            with contextlib.suppress(queue.Full):
                channel.events.put_nowait(("broken", why))
        self.stream.shutdown()

    def close(self, why: str = "closed") -> None:
        """Give the agent up: close the stream (the agent kills its commands when its stdin ends)."""
        self._fail(why)
        self.stream.close()

    def wait_hello(self, until: float, requirement: str) -> dict[str, Any]:
        self._hello_seen.wait(max(until - time.monotonic(), 0))
        if self.hello is not None:
            return self.hello
        if self.broken is not None:
            raise SandboxFailedError(f"the in-sandbox agent could not start ({self.broken}); {requirement}")
        self.close("no HELLO")
        raise SandboxFailedError("the in-sandbox agent did not answer when it started")

    def ping(self, timeout: float) -> bool:
        """True when the agent answers a PING within ``timeout`` seconds (its PONG carries our token)."""
        token = uuid.uuid4().hex
        waiter = threading.Event()
        with self._lock:
            if self.broken is not None:
                return False
            self._pongs[token] = waiter
        try:
            self.send(encode(FrameType.PING, 0, {"ping": token}), time.monotonic() + timeout)
            answered = waiter.wait(timeout)
        except SandboxFailedError:
            answered = False
        finally:
            with self._lock:
                self._pongs.pop(token, None)
        return answered and self.broken is None

    # -- channels and writing ------------------------------------------------------------------------
    def open_channels(self) -> int:
        """How many channels are open (a command's, a program's, a terminal's, a listener's, a connection)."""
        with self._lock:
            return len(self._channels) + self.connections.open_connections

    def numbering(self) -> tuple[int, int, int]:
        """Where its channel numbers are: the next channel, the highest connection, the next dial."""
        with self._lock:
            return (self._next_channel, *self.connections.numbering())

    def continue_from(self, numbering: tuple[int, int, int]) -> None:
        """Number channels on from ``numbering`` (the same agent's, over an earlier stream)."""
        self._next_channel = numbering[0]
        self.connections.continue_from(numbering[1:])

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
            self.stream.write(data, until)
        except OSError as exc:
            self._fail(f"could not write to the in-sandbox agent: {exc}")
            raise SandboxFailedError(
                f"the in-sandbox agent did not answer (writing to it failed: {exc})"
            ) from exc
        finally:
            self._write_lock.release()


def _next_event(agent: _Agent, channel: _Channel, wait: float, unknown: str) -> _Event | None:
    """The channel's next event within ``wait`` seconds, or None (the caller re-checks its deadlines).

    ``SandboxFailedError`` saying ``unknown`` when the agent broke and nothing is left queued.
    """
    try:
        return channel.events.get(timeout=max(wait, 0.001))
    except queue.Empty:
        if agent.broken is not None and channel.events.empty():
            raise SandboxFailedError(f"{agent.broken}; {unknown}") from None
        return None


class AgentTransport:
    """:class:`CommandTransport` over one long-lived agent per container (docs/docker/agent-channel.md).

    ``open_stream`` is how the engine starts an agent process and opens its stream (:mod:`.streams`);
    everything above it (frames, channels, deadlines, restarts, file operations) is the same on every
    engine. ``on_restart`` is told why when an agent had to be replaced; ``launch`` starts a stand-in
    agent instead (tests), else :func:`.static_agent.agent_launch` says how.
    ``setid_allowed`` starts every agent of this transport without the set-id filter, for a sandbox
    where set-id files may exist (its workspace never a bind mount of the host's); the default keeps the
    filter on every command and file operation, and either way an agent whose HELLO does not say what was
    asked for is refused.
    """

    channel: ClassVar[str] = "agent"

    def __init__(
        self,
        open_stream: AgentStreamOpener,
        *,
        on_restart: Callable[[str], None] | None = None,
        launch: AgentLaunch | None = None,
        setid_allowed: bool = False,
        resident: ResidentOpener | None = None,
    ) -> None:
        self._open_stream = open_stream
        self._resident = resident
        self._keeper_bound = False
        #: The agent that is the container keeper's child (``resident``), once started.
        self._resident_agent: _Agent | None = None
        self._setid_allowed = setid_allowed
        self._lock = threading.Lock()
        self._agents: dict[str, _Agent] = {}
        self._last: _Agent | None = None
        #: The listeners (and their handlers) of each agent let go, served again when it comes back.
        self._let_go: dict[str, dict[int, ConnectionHandler]] = {}
        self._protected: str | None = None
        self._started = 0
        self._on_restart = on_restart
        self._launch = launch

    @property
    def setid_allowed(self) -> bool:
        """True when this transport's agents run without the set-id filter (asked for, and confirmed)."""
        return self._setid_allowed

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

    def ping(self, user: str, timeout: float) -> bool:
        """True when ``user``'s running agent answers a PING within ``timeout`` (starts no agent).

        The Docker warm pool's health check (``executor/backends/docker/pool.py``): a round trip through
        the agent's stream, so a container killed or frozen from outside, or an agent that died, answers
        False.
        """
        with self._lock:
            agent = self._agents.get(user)
        return agent is not None and agent.broken is None and agent.ping(timeout)

    def serve_connections(
        self,
        user: str,
        handler: ConnectionHandler,
        *,
        port: int = 0,
        address: str | None = None,
        timeout: float = AGENT_START_SECONDS,
    ) -> int:
        """Have ``user``'s agent listen on ``127.0.0.1:port`` (0: any free port); the port it listens on.

        ``address`` listens on another loopback address (``127.0.0.0/8`` only, else
        :class:`InvalidRequestError`; an agent that does not offer dialing is refused with
        :class:`PolicyNotEnforceableError`: it would listen on ``127.0.0.1`` instead). An address or port
        in use is an ``OSError`` (``EADDRINUSE``).

        Each connection accepted there is carried over the channel and given to ``handler`` as a
        :class:`~.connections.ConnectionStream` in a thread of its own (the proxy endpoint, see
        :mod:`.frames`). An agent whose HELLO does not offer the proxy endpoint is refused with
        :class:`PolicyNotEnforceableError`: a network policy is never weakened to no policy. The listener
        lives as long as that agent (a replacement agent has none until this is called again).
        """
        return self._listen(user, handler, port=port, address=address, direct=None, timeout=timeout)[0]

    def serve_proxy(
        self,
        user: str,
        handler: ConnectionHandler,
        *,
        direct: tuple[str, str] | None = None,
        timeout: float = AGENT_START_SECONDS,
    ) -> tuple[int, str]:
        """The proxy endpoint (:meth:`serve_connections` on any free port): its port and how it is carried.

        ``direct`` is ``(path, token)``: a Unix socket the host listens on, at ``path`` inside the sandbox,
        and the token each connection must open with (the direct path of :mod:`.frames`). It is offered
        only to an agent whose HELLO says ``"unix"``; the agent answers whether it could reach the socket.
        The mode is ``"unix"`` (connections go to that socket, never to ``handler``) or ``"frames"`` (over
        the channel, to ``handler``: no ``direct``, an older agent, or a socket it could not connect to).
        """
        if direct is not None:
            agent = self._agent_for(user, time.monotonic() + timeout)
            offered = (agent.hello or {}).get("unix", 0)
            if not (isinstance(offered, int) and offered >= UNIX_VERSION):
                direct = None
        return self._listen(user, handler, port=0, address=None, direct=direct, timeout=timeout)

    def _listen(
        self,
        user: str,
        handler: ConnectionHandler,
        *,
        port: int,
        address: str | None,
        direct: tuple[str, str] | None,
        timeout: float,
    ) -> tuple[int, str]:
        listen: dict[str, Any] = {"port": port}
        if direct is not None:
            listen["unix"], listen["token"] = direct
        if address is not None:
            try:
                listen["address"] = validate_listen_address(address)
            except ProtocolError as exc:
                raise InvalidRequestError(str(exc)) from None
        until = time.monotonic() + timeout
        agent = self._agent_for(user, until)
        hello = agent.hello or {}
        if address is not None:
            self._need_dialing(hello, f"listen on {address}")
        self._need_proxy(hello)
        number, channel = agent.open_channel()
        agent.connections.add_listener(number, handler)
        try:
            agent.send(encode(FrameType.LISTEN, number, listen), until + AGENT_GRACE_SECONDS)
            while True:
                event = _next_event(agent, channel, until - time.monotonic(), "the listener is not known")
                if event is None:
                    if time.monotonic() < until:
                        continue
                    self._abandon(agent, "it did not answer a LISTEN in time")
                    raise SandboxFailedError("the in-sandbox agent did not answer a LISTEN in time")
                kind, value = event
                if kind == "result" and isinstance(value.get("port"), int) and "error" not in value:
                    return int(value["port"]), self._listen_mode(agent, value, direct is not None)
                if kind == "result":
                    error = value.get("error") or {}
                    why = f"the in-sandbox agent cannot listen: {error.get('message')}"
                    raise OSError(int(error.get("errno", 5)), why)
                if kind == "broken":
                    raise SandboxFailedError(f"{value}; the listener is not known")
                self._abandon(agent, f"it answered a LISTEN with {kind}")
                raise SandboxFailedError(
                    f"the in-sandbox agent answered a LISTEN with {kind}; it was replaced"
                )
        except BaseException:
            agent.connections.remove_listener(number)
            raise
        finally:
            agent.close_channel(number)

    def dial(self, user: str, port: int, *, timeout: float = AGENT_START_SECONDS) -> ConnectionStream:
        """A connection to ``127.0.0.1:port`` inside the sandbox, through ``user``'s agent (DIAL).

        Bytes only: the stream (:class:`~.connections.ConnectionStream`) is the same as an accepted one,
        and the caller closes it. ``ConnectionRefusedError`` when nothing listens there (or the agent holds
        its most connections), ``TimeoutError`` when the agent did not answer within ``timeout`` (it is
        not given up for that: a connect may take long), :class:`PolicyNotEnforceableError` for an agent
        that does not offer dialing.
        """
        if not (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535):
            raise InvalidRequestError(f"port must be an integer 1..65535, not {port!r}")
        until = time.monotonic() + timeout
        agent = self._agent_for(user, until)
        self._need_dialing(agent.hello or {}, f"connect to port {port}")
        try:
            return agent.connections.dial(port, until)
        except SandboxFailedError as exc:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"the in-sandbox agent failed: {exc}") from exc

    def require_dialing(self, user: str, what: str) -> None:
        """:class:`PolicyNotEnforceableError` (naming ``what``) unless ``user``'s agent offers DIAL."""
        agent = self._agent_for(user, time.monotonic() + AGENT_START_SECONDS)
        self._need_dialing(agent.hello or {}, what)

    def _listen_mode(self, agent: _Agent, answer: dict[str, Any], asked: bool) -> str:
        """The mode a LISTEN's answer says (``"frames"`` unless the direct path was asked for and taken)."""
        mode = answer.get("mode", "frames") if asked else "frames"
        if mode not in ("unix", "frames"):
            self._abandon(agent, f"it answered a LISTEN with mode {mode!r}")
            raise SandboxFailedError(f"the in-sandbox agent answered a LISTEN with mode {mode!r}")
        return str(mode)

    @staticmethod
    def _need_proxy(hello: dict[str, Any]) -> None:
        offered = hello.get("proxy", 0)
        if not (isinstance(offered, int) and offered >= PROXY_VERSION):
            raise PolicyNotEnforceableError(
                f"the in-sandbox agent ({hello.get('agent', 'unnamed')}) does not serve the proxy endpoint "
                f"(its HELLO says proxy={offered!r}), so a network policy cannot be enforced in this "
                "sandbox; it is refused"
            )

    @staticmethod
    def _need_dialing(hello: dict[str, Any], what: str) -> None:
        offered = hello.get("dial", 0)
        if not (isinstance(offered, int) and offered >= DIAL_VERSION):
            raise PolicyNotEnforceableError(
                f"the in-sandbox agent ({hello.get('agent', 'unnamed')}) does not offer dialing (its HELLO "
                f"says dial={offered!r}), so it cannot {what}; it is refused"
            )

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
            agent, hello = self._start_agent(user, start_by)
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

    def _start_agent(self, user: str, start_by: float) -> tuple[_Agent, dict[str, Any]]:
        """Start an agent as ``user`` (:func:`.static_agent.agent_launch`, or the stand-in's launch).

        The first agent of the keeper's user is the keeper's own (``resident``): the keeper's stdin gets
        the agent's bytes and then the user, as two 32-bit little-endian numbers.
        """
        launch = self._launch
        if launch is None:
            try:
                launch = agent_launch(self._protected, setid_allowed=self._setid_allowed)
            except StaticAgentUnavailableError as exc:
                raise SandboxFailedError(f"the in-sandbox agent is not available: {exc}") from exc
        stream = self._resident(user, start_by) if self._resident is not None else None
        if stream is None:
            return self._start_launch(launch, self._open_stream(launch.argv, user, start_by), user, start_by)
        uid, _, gid = user.partition(":")
        preamble = b"" if self._keeper_bound else launch.preamble
        named = preamble + struct.pack("<II", int(uid), int(gid))
        started = self._start_launch(AgentLaunch([], named, launch.requirement), stream, user, start_by)
        self._resident_agent = started[0]
        return started

    def use_keeper(self, resident: ResidentOpener, *, bound: bool = False) -> None:
        """Start the first agent of the keeper's user as the container keeper's child (see ``resident``).

        ``bound``: the keeper runs the agent's bound binary, so its stdin gets the user only.
        """
        self._resident = resident
        self._keeper_bound = bound

    @property
    def resident_user(self) -> str | None:
        """The user whose agent is the container keeper's child and serves now, else None."""
        with self._lock:
            agent = self._resident_agent
            if agent is None or agent.broken is not None or self._agents.get(agent.user) is not agent:
                return None
            return agent.user

    def users(self) -> list[str]:
        """The users whose agents run now."""
        with self._lock:
            return [user for user, agent in self._agents.items() if agent.broken is None]

    def listeners_of(self, user: str, handler: ConnectionHandler) -> tuple[int, ...]:
        """The LISTEN channels of ``user``'s agent whose connections ``handler`` serves."""
        with self._lock:
            agent = self._agents.get(user)
        return () if agent is None else agent.connections.listeners_of(handler)

    def in_use(self, user: str) -> int:
        """How many channels of ``user``'s agent are open: programs, terminals, listeners, connections."""
        with self._lock:
            agent = self._agents.get(user)
        return 0 if agent is None else agent.open_channels()

    def detach(self, user: str) -> DetachedAgent:
        """Let go of ``user``'s agent without ending it (a keeper's child, before a checkpoint).

        Its stream is closed on this side only: the keeper's stdin stays open, so the agent waits for the
        next stream. Returns what :meth:`reattach` needs to serve the same agent again. Its listeners
        (the proxy endpoint, service links) are kept here, served again when it comes back.
        """
        described = self.describe(user)
        with self._lock:
            agent = self._agents.pop(user)
            self._let_go[user] = agent.connections.listening()
            if self._last is agent:
                self._last = None
        agent.close("detached for a checkpoint")
        return described

    def describe(self, user: str) -> DetachedAgent:
        """What :meth:`reattach` needs to serve a copy of ``user``'s agent, which stays served here.

        A fork: the copy runs in another sandbox made from this one's memory, taken while no call runs.
        """
        with self._lock:
            agent = self._agents[user]
            resident = self._resident_agent is agent
        return DetachedAgent(agent.user, dict(agent.hello or {}), agent.numbering(), resident)

    def reattach(
        self,
        detached: DetachedAgent,
        stream: AgentStream,
        until: float,
        *,
        resident: bool = False,
        listeners: Mapping[int, ConnectionHandler] | None = None,
    ) -> None:
        """Serve a detached agent over a new stream (the same agent, after a restore): it must answer a PING.

        Channel numbers go on from where they were: the agent never sees one used twice. ``resident``: it is
        this container keeper's agent (a copy restored from another container's checkpoint). ``listeners``:
        the agent's listeners (LISTEN channels it still holds) to serve here, with their handlers (default:
        those it had when this transport let it go); a connection of any other listener is closed.
        """
        with self._lock:
            kept = self._let_go.pop(detached.user, {})
        agent = _Agent(
            stream,
            detached.user,
            detached.hello,
            numbering=detached.numbering,
            listeners=kept if listeners is None else listeners,
        )
        if not agent.ping(max(until - time.monotonic(), 0.1)):
            why = agent.broken or "no answer"
            agent.close()
            raise SandboxFailedError(f"the in-sandbox agent did not answer after the restore ({why})")
        with self._lock:
            self._agents[agent.user] = agent
            self._last = agent
            if resident or detached.resident:
                self._resident_agent = agent

    def _start_launch(
        self, launch: AgentLaunch, stream: AgentStream, user: str, start_by: float
    ) -> tuple[_Agent, dict[str, Any]]:
        agent = _Agent(stream, user)
        try:
            if launch.preamble:
                try:
                    agent.send(launch.preamble, start_by)
                except SandboxFailedError as exc:
                    raise SandboxFailedError(
                        f"the in-sandbox agent could not start ({exc}); {launch.requirement}"
                    ) from exc
            hello = agent.wait_hello(start_by, launch.requirement)
            self._check_setid(hello, launch)
            return agent, hello
        except BaseException:
            agent.close()
            raise

    def _check_setid(self, hello: dict[str, Any], launch: AgentLaunch) -> None:
        """Refuse an agent whose set-id filter is not what this transport asked for.

        An agent that says the wrong thing, or nothing, is not one that could not start. Without the filter a
        command of a bind-mounted workspace could plant a set-uid file the host honours; with it, a
        sandbox that must install set-uid programs (dpkg) would fail in ways far from the cause.
        """
        wanted = "allowed" if self._setid_allowed else "refused"
        said = hello.get("setid")
        if said == wanted:
            return
        what = "without" if self._setid_allowed else "with"
        raise PolicyNotEnforceableError(
            f"the in-sandbox agent was started {what} the set-id seccomp filter, but its "
            f"HELLO says setid={said!r} where {wanted!r} was asked for"
            + (" (there is no filter for this architecture)" if said == "unavailable" else "")
            + "; it is refused"
        )

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
            "max_output_bytes": capture.head_bytes,
            # The agent keeps the stream's last tail_bytes too and sends them before EXIT (0: none).
            "tail_bytes": capture.tail_bytes,
            "stdin": command.stdin is not None,
        }
        if command.background:
            run["background"] = True  # what it leaves running is kept, not killed at its exit
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
                event = _next_event(agent, channel, wait, "the command's end is unknown (it is not re-run)")
                if event is None:
                    continue
                kind, value = event
                if kind in ("stdout", "stderr"):
                    stream: Stream = "stdout" if kind == "stdout" else "stderr"
                    capture.feed(stream, value)
                elif kind == "exit":
                    return self._outcome(value, stopped, capture)
                elif kind == "refused":
                    raise InvalidRequestError(f"{value}; nothing ran")
                elif kind == "error":
                    raise SandboxFailedError(f"the in-sandbox agent could not run the command: {value}")
                else:  # broken
                    raise SandboxFailedError(f"{value}; the command's end is unknown (it is not re-run)")
        except BaseException as exc:
            # A refusal ended the channel with nothing started: there is nothing to kill.
            if isinstance(exc, (SandboxFailedError, InvalidRequestError)) or stopped is not None:
                raise
            # The caller's thread was interrupted while reading (a failing on_output callback, a
            # KeyboardInterrupt): the command must not keep running behind the exception.
            self._kill_after_error(agent, number, channel)
            raise

    def start_live(
        self,
        command: PreparedCommand,
        make: Callable[[_Agent, int, _Channel], _Live],
        *,
        deadline: float,
        size: tuple[int, int] | None = None,
    ) -> _Live:
        """Start ``command`` as a live program (:mod:`.live`), on a terminal of ``size`` (rows, cols) if any.

        It lives until ``deadline`` (monotonic) at most; ``make`` wraps its channel (a :class:`.Terminal`,
        a :class:`.live.Process`). The agent's answer is known before this returns: a PING after the RUN
        comes back after the RUN's ERROR, if any (the agent takes frames in order), so a refusal (too many
        terminals) raises :class:`InvalidRequestError` and a failure :class:`SandboxFailedError` here,
        with nothing left open.
        """
        until = time.monotonic() + AGENT_START_SECONDS
        agent = self._agent_for(command.user, until)
        offered = (agent.hello or {}).get("pty", 0)
        if not (isinstance(offered, int) and offered >= PTY_VERSION):
            raise PolicyNotEnforceableError(
                f"the in-sandbox agent ({(agent.hello or {}).get('agent', 'unnamed')}) runs no live "
                f"programs (its HELLO says pty={offered!r}); a terminal or a spawned program cannot run "
                "in this sandbox"
            )
        number, channel = agent.open_channel()
        run: dict[str, Any] = {
            "argv": list(command.argv),
            "env": command.env,
            "cwd": command.workdir,
            "timeout": max(deadline - time.monotonic(), 0.0),
        }
        if size is not None:
            run.update(pty=True, rows=size[0], cols=size[1])
        else:
            run.update(paced=True, stdin=True)
        try:
            agent.send(encode(FrameType.RUN, number, run), until)
            if not agent.ping(AGENT_START_SECONDS):
                why = agent.broken or "the in-sandbox agent did not answer starting a live program"
                raise SandboxFailedError(why)
            kind, value = channel.events.queue[0] if channel.events.qsize() else ("", None)
            if kind == "refused":
                raise InvalidRequestError(f"{value}; nothing was started")
            if kind == "error":
                raise SandboxFailedError(f"the in-sandbox agent could not start it: {value}")
        except BaseException:
            agent.close_channel(number)
            raise
        return make(agent, number, channel)

    def _kill_after_error(self, agent: _Agent, number: int, channel: _Channel) -> None:
        until = time.monotonic() + KILL_ON_ERROR_SECONDS
        try:
            agent.send(encode(FrameType.KILL, number), until)
            while time.monotonic() < until:
                try:
                    kind, _ = channel.events.get(timeout=max(until - time.monotonic(), 0.001))
                except queue.Empty:
                    break
                if kind in ("exit", "error", "refused", "broken", "result"):
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
        oom_kills = body.get("oom_kills")  # optional (validated by the decoder): None when unknown
        if timed_out or stopped == "cancel":
            return CommandOutcome(
                exit_code=None, timed_out=timed_out, cancelled=not timed_out, oom_kills=oom_kills
            )
        code, sig = body["exit_code"], body["signal"]
        if code is not None:
            return CommandOutcome(exit_code=int(code), oom_kills=oom_kills)
        return CommandOutcome(exit_code=128 + int(sig) if sig is not None else None, oom_kills=oom_kills)

    # -- file operations -----------------------------------------------------------------------------
    def file_op(
        self,
        user: str,
        request: dict[str, Any],
        data: bytes | None = None,
        *,
        deadline: float,
        max_output: int = 0,
    ) -> tuple[dict[str, Any], bytes]:
        """Perform one FILE operation as ``user``: its RESULT body and the STDOUT bytes sent before it.

        ``request`` is the FILE body (``{"op", "path", ...}``, already validated); ``data`` the bytes of a
        ``write``. At ``deadline`` the operation is KILLed (a write then leaves its path unchanged) and
        :class:`FileOpCancelledError` raised; an agent that sends more than ``max_output`` bytes, anything
        but STDOUT and RESULT, a RESULT that does not fit the op, or nothing by the deadline plus
        :data:`AGENT_GRACE_SECONDS` is given up (:class:`SandboxFailedError`). An operation is never
        retried once sent: its effect is unknown.
        """
        agent = self._agent_for(user, deadline + AGENT_GRACE_SECONDS)
        ops = (agent.hello or {}).get("ops")
        if not isinstance(ops, list) or request["op"] not in ops:
            # Nothing was sent and the agent is fine: the request cannot be served by this agent.
            raise InvalidRequestError(
                f"the in-sandbox agent ({(agent.hello or {}).get('agent', 'unnamed')}) does not perform the "
                f"file operation {request['op']!r} (it offers {ops!r}); the agent of this version performs "
                "them all, so this is another agent program (a stand-in's launch): start the session without "
                "one"
            )
        number, channel = agent.open_channel()
        try:
            return self._file_op(agent, number, channel, request, data, deadline, max_output)
        except BaseException as exc:
            if not isinstance(exc, (SandboxFailedError, FileOpCancelledError)):
                self._kill_after_error(agent, number, channel)  # interrupted: do not leave it running
            raise
        finally:
            agent.close_channel(number)

    def _file_op(  # noqa: PLR0912, PLR0917 - one loop: every way an operation's wait can end
        self,
        agent: _Agent,
        number: int,
        channel: _Channel,
        request: dict[str, Any],
        data: bytes | None,
        deadline: float,
        max_output: int,
    ) -> tuple[dict[str, Any], bytes]:
        op = str(request["op"])
        agent.send(encode(FrameType.FILE, number, request), deadline + AGENT_GRACE_SECONDS)
        killed = False

        def kill() -> float:
            agent.send(encode(FrameType.KILL, number), time.monotonic() + AGENT_GRACE_SECONDS)
            return time.monotonic() + AGENT_GRACE_SECONDS

        give_up = deadline + AGENT_GRACE_SECONDS
        if data is not None:
            # In slices, so a concurrent command's frames are not held up by a big write; stops early when
            # the agent already answered (an error before the data, e.g. the file exists).
            view = memoryview(data)
            for start in range(0, len(data), _SEND_SLICE):
                if not channel.events.empty():
                    break
                if time.monotonic() >= deadline:
                    killed, give_up = True, kill()
                    break
                piece = view[start : start + _SEND_SLICE]
                frames = [encode(FrameType.STDIN, number, bytes(piece[i : i + STDIN_CHUNK]))
                          for i in range(0, len(piece), STDIN_CHUNK)]  # fmt: skip
                agent.send(b"".join(frames), deadline + AGENT_GRACE_SECONDS)
            else:
                agent.send(encode(FrameType.STDIN, number), deadline + AGENT_GRACE_SECONDS)
        received = bytearray()
        while True:
            now = time.monotonic()
            if not killed and now >= deadline:
                killed, give_up = True, kill()
            if now >= give_up:
                self._abandon(agent, "it did not answer a file operation in time")
                raise SandboxFailedError(
                    f"the in-sandbox agent did not answer the file operation {op} on {request['path']!r} "
                    f"within {AGENT_GRACE_SECONDS:g} s of its deadline; it was replaced (the operation is "
                    "not retried)"
                )
            wait = (give_up if killed else deadline) - now
            event = _next_event(agent, channel, wait, "the file operation's effect is unknown")
            if event is None:
                continue
            kind, value = event
            if kind == "broken":
                raise SandboxFailedError(f"{value}; the file operation's effect is unknown")
            if kind in ("error", "refused"):
                raise SandboxFailedError(
                    f"the in-sandbox agent could not perform the file operation: {value}"
                )
            try:
                if kind == "stdout":
                    received += value
                    if len(received) > max_output:
                        raise ProtocolError(f"{op} sent over {max_output} bytes")
                    continue
                if kind != "result":
                    raise ProtocolError(f"{kind} on the channel of a file operation")
                validate_result_for(op, value, bytes(received))
            except ProtocolError as exc:
                self._abandon(agent, f"it broke protocol version 1: {exc}")
                raise SandboxFailedError(
                    f"the in-sandbox agent broke protocol version 1 ({exc}); it was replaced"
                ) from None
            if killed and "error" in value:
                raise FileOpCancelledError(op, str(request["path"]))
            return value, bytes(received)


class FileOpCancelledError(TimeoutError):
    """A file operation did not finish by its deadline and was cancelled inside the container."""

    def __init__(self, op: str, path: str) -> None:
        super().__init__(
            errno.ETIMEDOUT,
            f"the file operation {op} did not finish in time and was cancelled (a write leaves the file "
            "unchanged)",
            path,
        )
