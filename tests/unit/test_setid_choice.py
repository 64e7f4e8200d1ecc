"""The set-id filter as a per-channel choice: argv building, the HELLO check and the start-up probe's
verdict (no engine; the real containers, and the agent's own parsing of its arguments, are
tests/integration/test_docker_setid_choice.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.channel import static_agent as _static_agent
from adk_sandbox.executor.channel.agent import SETID_ALLOWED_WORD
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.frames import (
    HOST_TO_AGENT,
    FrameDecoder,
    FrameType,
    ProtocolError,
    encode,
    validate_hello,
)
from adk_sandbox.executor.channel.probe import verify_from_inside
from adk_sandbox.executor.channel.setid import native_arch
from adk_sandbox.executor.channel.static_agent import StaticAgent, agent_launch, filter_header
from adk_sandbox.executor.channel.transport import CommandOutcome, PreparedCommand
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.types import Stream

FAKE_STATIC = StaticAgent(agent=b"\x7fELF agent", loader=b"\x7fELF loader", digest="0" * 64)


@pytest.fixture(autouse=True)
def static_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """agent_launch uses a fake binary without building one (its argv is what is tested)."""
    monkeypatch.setattr(_static_agent, "_static_or_reason", lambda: FAKE_STATIC)


# -- argv building ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("protected", [None, "1:100"])
def test_the_agent_launches_with_the_word_only_when_asked(protected: str | None) -> None:
    for setid_allowed in (False, True):
        launch = agent_launch(protected, setid_allowed=setid_allowed)
        # The loader: sh -c SCRIPT NAME BYTES, then the agent's own arguments (passed on after its name):
        # the word right after the name, the protected list last.
        assert launch.argv[3:5] == ["adk-sandbox-agent-loader", str(len(FAKE_STATIC.agent))]
        assert launch.preamble == FAKE_STATIC.agent
        expected = [*([SETID_ALLOWED_WORD] if setid_allowed else []), *([protected] if protected else [])]
        assert launch.argv[5:] == expected


# -- the agent: one spelling of its word ------------------------------------------------------------------
def test_one_spelling_of_the_word_everywhere() -> None:
    assert f'#define SETID_ALLOWED_WORD "{SETID_ALLOWED_WORD}"\n' in filter_header(native_arch())
    agent_c = resources.files("adk_sandbox.executor.channel.inside").joinpath("agent.c")
    assert "SETID_ALLOWED_WORD" in agent_c.read_text(encoding="utf-8")


# -- HELLO ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["refused", "allowed", "unavailable"])
def test_hello_setid_values(value: str) -> None:
    validate_hello({"protocol": 1, "pid": 1, "subreaper": True, "setid": value})


@pytest.mark.parametrize("value", [True, "off", None, ""])
def test_hello_setid_must_be_one_of_the_states(value: object) -> None:
    with pytest.raises(ProtocolError, match="setid"):
        validate_hello({"protocol": 1, "pid": 1, "subreaper": True, "setid": value})


class _FakeAgentStream:
    """An agent that says HELLO with ``hello``, then answers each RUN with an EXIT (status 0).

    The bytes of the (fake) binary the loader reads come first: they are skipped.
    """

    def __init__(self, hello: dict[str, Any]) -> None:
        self._out: queue.Queue[bytes | None] = queue.Queue()
        self._out.put(encode(FrameType.HELLO, 0, hello))
        self._decoder = FrameDecoder(HOST_TO_AGENT, expect_hello=False)
        self.runs = 0
        self.closed = threading.Event()
        self._binary = len(FAKE_STATIC.agent)

    def read(self) -> list[tuple[Stream, bytes]] | None:
        data = self._out.get()
        return None if data is None else [("stdout", data)]

    def write(self, data: bytes, until: float) -> None:
        skipped = min(self._binary, len(data))
        self._binary -= skipped
        for frame in self._decoder.feed(data[skipped:]):
            if frame.type == FrameType.RUN:
                self.runs += 1
                exit_body = {"exit_code": 0, "signal": None, "timed_out": False, "stdout_dropped": 0,
                             "stderr_dropped": 0}  # fmt: skip
                self._out.put(encode(FrameType.EXIT, frame.channel, exit_body))

    def shutdown(self) -> None:
        self.closed.set()
        self._out.put(None)

    def close(self) -> None:
        self.shutdown()


def _transport(
    hello: dict[str, Any], **kwargs: Any
) -> tuple[AgentTransport, list[list[str]], list[_FakeAgentStream]]:
    argvs: list[list[str]] = []
    streams: list[_FakeAgentStream] = []

    def open_stream(argv: list[str], user: str, until: float) -> _FakeAgentStream:
        argvs.append(argv)
        streams.append(_FakeAgentStream(hello))
        return streams[-1]

    return AgentTransport(open_stream, **kwargs), argvs, streams


def _run(transport: AgentTransport) -> CommandOutcome:
    command = PreparedCommand(argv=("true",), env={}, user="0:0", workdir="/", stdin=None, marker="m")
    return transport.run(command, OutputCapture(64), deadline=time.monotonic() + 10, cancel=None)


HELLO = {"protocol": 1, "pid": 5, "subreaper": True, "agent": "static"}


@pytest.mark.parametrize("setid_allowed", [False, True])
def test_an_agent_that_says_what_was_asked_runs_commands(setid_allowed: bool) -> None:
    said = "allowed" if setid_allowed else "refused"
    transport, argvs, streams = _transport({**HELLO, "setid": said}, setid_allowed=setid_allowed)
    try:
        assert _run(transport).exit_code == 0
        assert streams[0].runs == 1
        assert (SETID_ALLOWED_WORD in argvs[0]) is setid_allowed
        assert transport.setid_allowed is setid_allowed
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("setid_allowed", "said"),
    [(False, "allowed"), (False, "unavailable"), (False, None), (True, "refused"), (True, None)],
)
def test_an_agent_that_says_otherwise_is_refused_before_any_command(
    setid_allowed: bool, said: str | None
) -> None:
    hello = {**HELLO, **({"setid": said} if said is not None else {})}
    transport, _, streams = _transport(hello, setid_allowed=setid_allowed)
    try:
        with pytest.raises(PolicyNotEnforceableError, match="set-id") as refused:
            _run(transport)
        assert f"setid={said!r}" in str(refused.value)
        assert streams[0].runs == 0  # nothing was sent to it
        assert streams[0].closed.is_set()  # and it was given up (its stdin ends: it kills what it has)
        assert transport.agent_pid is None
    finally:
        transport.close()


def test_the_default_transport_asks_for_the_filter() -> None:
    transport, argvs, _ = _transport({**HELLO, "setid": "allowed"})
    try:
        with pytest.raises(PolicyNotEnforceableError, match="'refused' was asked for"):
            _run(transport)
        assert SETID_ALLOWED_WORD not in argvs[0]
    finally:
        transport.close()


# -- the start-up probe's verdict -------------------------------------------------------------------------
class _ScriptedTransport:
    """Answers the probe with ``stdout`` (what the container would print)."""

    channel = "agent"

    def __init__(self, stdout: str) -> None:
        self._stdout = stdout

    def close(self) -> None:
        pass

    def run(
        self,
        command: PreparedCommand,
        capture: OutputCapture,
        *,
        deadline: float,
        cancel: threading.Event | None,
    ) -> CommandOutcome:
        capture.feed("stdout", self._stdout.encode())
        return CommandOutcome(exit_code=0)


def _verify(stdout: str, **kwargs: bool) -> Callable[[], None]:
    return lambda: verify_from_inside(_ScriptedTransport(stdout), {}, "0:0", None, **kwargs)


def test_the_probe_requires_set_id_refused_by_default() -> None:
    _verify("setid-refused\n")()
    with pytest.raises(PolicyNotEnforceableError, match="can create setuid"):
        _verify("setid-allowed\n")()


def test_the_probe_requires_set_id_allowed_when_asked() -> None:
    _verify("setid-allowed\n", setid_allowed=True)()
    with pytest.raises(PolicyNotEnforceableError, match="cannot create setuid/setgid files although"):
        _verify("setid-refused\n", setid_allowed=True)()


@pytest.mark.parametrize("setid_allowed", [False, True])
def test_a_probe_that_could_not_check_is_never_a_pass(setid_allowed: bool) -> None:
    with pytest.raises(PolicyNotEnforceableError, match="no writable /tmp"):
        _verify("", setid_allowed=setid_allowed)()
