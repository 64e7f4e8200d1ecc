"""The set-id filter as a per-channel choice (issue 22: a task sandbox must let dpkg install set-uid files).

Real engine, runc and gVisor, on the agent channel. The *permissive* container is what a task sandbox
leaves for set-id modes: root, Docker's own default seccomp profile (which lets ``chmod 4755`` through),
no-new-privileges, and the capabilities a package manager needs (CHOWN, DAC_OVERRIDE, FOWNER, FSETID,
SETUID, SETGID). So there the channel's own filter is all that refuses set-id modes:

* by default (no opt-in) ``chmod 4755`` fails and the agent's HELLO says ``refused``;
* with ``setid_allowed=True`` it succeeds (in /tmp and on the writable root, where dpkg installs), HELLO
  says ``allowed``, and the start-up probe proves each choice (and refuses the other);
* a host that asked for the filter refuses an agent that says it has none (and the other way round),
  before any command reaches it;
* the agents still recognise each other, keep their protected list and refuse a malformed argv, with the
  new word;
* in the hardened container (the project's seccomp profile), the opt-in does not weaken anything: the
  profile still refuses, and the probe says so.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from adk_sandbox.executor import PolicyNotEnforceableError, SandboxFailedError
from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend
from adk_sandbox.executor.backends.docker._daemon import daemon_socket_path
from adk_sandbox.executor.backends.docker._exec import DockerExecs
from adk_sandbox.executor.channel.agent import SETID_ALLOWED_WORD
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.probe import verify_from_inside
from adk_sandbox.executor.channel.streams import AgentStream, AgentStreamOpener
from adk_sandbox.executor.channel.transport import DEFAULT_PATH, CommandTransport, PreparedCommand
from tests.conftest import require, unique_sleep_seconds

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

QUICK = 30.0
#: What a package manager needs to install set-uid programs as root (a subset of Docker's defaults).
TASK_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"]
ENV = {"PATH": DEFAULT_PATH}
#: Prints the modes it could give a fresh file in /tmp and on the root filesystem (dpkg's /usr).
SETID_SCRIPT = (
    'for f in /tmp/setid-$$ /usr/local/bin/setid-$$; do : >"$f" && chmod 4755 "$f" && chmod g+s "$f"; '
    'echo "$f $? $(stat -c %a "$f")"; rm -f "$f"; done'
)


@contextlib.contextmanager
def _container(client: docker.DockerClient, runtime: str | None) -> Iterator[str]:
    if runtime:
        require("runsc" in client.info().get("Runtimes", {}), "gVisor's runsc is not registered with Docker")
    container = client.containers.run(
        BASE_IMAGE, ["sleep", "1200"], detach=True, network_mode="none", init=True, user="0:0",
        cap_drop=["ALL"], cap_add=TASK_CAPABILITIES, security_opt=["no-new-privileges"],  # Docker's seccomp
        tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=16m,mode=1777"}, mem_limit="512m", pids_limit=256,
        labels={"io.adk-sandbox.test": "setid-choice"}, **({"runtime": runtime} if runtime else {}),
    )  # fmt: skip
    try:
        yield str(container.id)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


#: Where a test runs, as ``permissive``'s parameter.
RUNTIMES = [pytest.param("runc", id="runc"), pytest.param("runsc", id="gvisor")]
#: Tests that start one agent after another in the same container run under runc only: under gVisor
#: (runsc 0.0~20240729, as installed here) a new agent replacing a live one sometimes ends the whole
#: sandbox (exit status 137, whichever uids the agents and the container's own processes have, with this
#: change's parent too), which is not what those tests are about.
RUNC_ONLY = [pytest.param("runc", id="runc")]


@pytest.fixture
def permissive(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> Iterator[str]:
    """A root container with Docker's default seccomp profile: set-id modes are the channel's choice.

    One per test (``request.param``: ``"runc"`` or ``"runsc"``), so no test meets another's agents.
    """
    runtime = None if request.param == "runc" else request.param
    with _container(docker_backend._client, runtime) as container_id:
        client = docker_backend._client
        until = time.monotonic() + QUICK  # its own process started (an agent's survey protects it)
        while "sleep 1200" not in _in_container(client, container_id, "ps", "-eo", "args="):
            assert time.monotonic() < until, "the container's own process did not start"
            time.sleep(0.05)
        yield container_id


def _transport(
    client: docker.DockerClient,
    container_id: str,
    *,
    setid_allowed: bool | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> AgentTransport:
    """The agent channel as a session makes it; ``setid_allowed=None`` passes nothing (the default)."""
    extra = {} if setid_allowed is None else {"setid_allowed": setid_allowed}
    opener: AgentStreamOpener = DockerExecs(client, container_id, daemon_socket_path()).open_agent_stream
    if wrap is not None:
        inner = opener

        def opener(argv: list[str], user: str, until: float) -> AgentStream:
            return inner(wrap(argv), user, until)

    return AgentTransport(opener, **extra)


def _run(
    transport: CommandTransport,
    script: str,
    *,
    user: str = "0:0",
    background: bool = False,
) -> tuple[int | None, str]:
    command = PreparedCommand(
        argv=("/bin/sh", "-c", script), env=ENV, user=user, workdir="/tmp", stdin=None,
        marker=uuid.uuid4().hex, background=background,
    )  # fmt: skip
    capture = OutputCapture(65536)
    outcome = transport.run(command, capture, deadline=time.monotonic() + QUICK * 2, cancel=None)
    streams = capture.finish()
    return outcome.exit_code, streams["stdout"].text + streams["stderr"].text


def _hello(transport: CommandTransport) -> dict[str, object]:
    assert isinstance(transport, AgentTransport)
    assert transport._last is not None and transport._last.hello is not None
    return transport._last.hello


def _in_container(client: docker.DockerClient, container_id: str, *argv: str) -> str:
    """Output of ``argv`` run by a separate exec as root, outside every transport."""
    created = client.api.exec_create(container_id, list(argv), user="0:0")
    return str(client.api.exec_start(created["Id"]).decode())


# -- the choice on the channel ---------------------------------------------------------------------------
@pytest.mark.parametrize("permissive", RUNTIMES, indirect=True)
def test_by_default_the_channel_refuses_set_id_modes_where_the_profile_would_not(
    docker_backend: DockerBackend, permissive: str
) -> None:
    transport = _transport(docker_backend._client, permissive)
    try:
        code, output = _run(transport, SETID_SCRIPT)
        assert code == 0, output
        assert output.count("Operation not permitted") == 2, output
        assert "4755" not in output and "6755" not in output, output
        verify_from_inside(transport, ENV, "0:0", None)
        with pytest.raises(PolicyNotEnforceableError, match="cannot create setuid/setgid files although"):
            verify_from_inside(transport, ENV, "0:0", None, setid_allowed=True)
        assert _hello(transport)["setid"] == "refused"
        assert _hello(transport)["agent"] == "static"
    finally:
        transport.close()


@pytest.mark.parametrize("permissive", RUNTIMES, indirect=True)
def test_with_the_opt_in_set_id_modes_work_and_hello_says_so(
    docker_backend: DockerBackend, permissive: str
) -> None:
    transport = _transport(docker_backend._client, permissive, setid_allowed=True)
    try:
        code, output = _run(transport, SETID_SCRIPT)
        assert code == 0, output
        lines = output.splitlines()
        assert [line.split()[1:] for line in lines] == [["0", "6755"], ["0", "6755"]], output
        verify_from_inside(transport, ENV, "0:0", None, setid_allowed=True)
        with pytest.raises(PolicyNotEnforceableError, match="can create setuid"):
            verify_from_inside(transport, ENV, "0:0", None)
        assert _hello(transport)["setid"] == "allowed"
        assert transport.setid_allowed
    finally:
        transport.close()


def _with_word(argv: list[str]) -> list[str]:
    """The launch with the opt-in word put in (right after the agent's name, where the agent reads it)."""
    return [*argv[:5], SETID_ALLOWED_WORD, *argv[5:]]


def _without_word(argv: list[str]) -> list[str]:
    return [word for word in argv if word != SETID_ALLOWED_WORD]


@pytest.mark.parametrize("permissive", RUNTIMES, indirect=True)
@pytest.mark.parametrize("asked", [False, True], ids=["asked-for-the-filter", "asked-for-none"])
def test_an_agent_that_is_not_what_the_host_asked_for_is_refused(
    docker_backend: DockerBackend, permissive: str, asked: bool
) -> None:
    """The launch is tampered with on its way (the word put in, or taken out): the agent does as its argv
    says, says so in HELLO, and the host refuses it before any command reaches it."""
    client = docker_backend._client
    wrap = _without_word if asked else _with_word
    transport = _transport(client, permissive, setid_allowed=asked, wrap=wrap)
    # In the root layer, not the /tmp tmpfs: readable from the host even once the container has stopped.
    mark = f"/var/tmp/ran-{uuid.uuid4().hex}"
    try:
        with pytest.raises(PolicyNotEnforceableError, match="set-id seccomp filter") as refused:
            _run(transport, f"touch {mark}")
        said = "refused" if asked else "allowed"
        assert f"setid={said!r}" in str(refused.value)
    finally:
        transport.close()
    # Read from the engine, not by an exec: under gVisor (runsc 20240729) ending a refused agent now and then
    # takes the whole sandbox with it, and a stopped container answers no exec.
    with pytest.raises(docker.errors.NotFound):
        client.api.get_archive(permissive, mark)


MALFORMED = {
    # One argument too many: the agent prints its usage.
    "too-many": (["1:1", "2:2"], "usage"),
    # A misspelt word is no protected list either: the agent says so.
    "misspelt": ([SETID_ALLOWED_WORD + "x"], "not a protected list"),
}


@pytest.mark.parametrize("permissive", RUNTIMES, indirect=True)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_an_agent_with_a_malformed_argv_does_not_start(
    docker_backend: DockerBackend, permissive: str, case: str
) -> None:
    """Anything but ``[setid-allowed] [<protected>]`` ends the agent before HELLO, so nothing runs with a
    choice nobody made (nor with a protected list that spares nothing)."""
    extra, message = MALFORMED[case]
    transport = _transport(docker_backend._client, permissive, wrap=lambda argv: [*argv, *extra])
    try:
        with pytest.raises(SandboxFailedError, match="could not start") as failed:
            _run(transport, "true")
        assert message in str(failed.value)
    finally:
        transport.close()


# -- the agents still find each other with the word ------------------------------------
@pytest.mark.parametrize("permissive", RUNC_ONLY, indirect=True)
def test_a_new_agent_kills_an_older_one_whatever_either_was_started_with(
    docker_backend: DockerBackend, permissive: str
) -> None:
    """An agent recognises another by its name's place on the argv: the word after it changes nothing."""
    client = docker_backend._client
    for old_allowed in (True, False):
        old = _transport(client, permissive, setid_allowed=old_allowed)
        new = _transport(client, permissive, setid_allowed=not old_allowed)
        try:
            mark = unique_sleep_seconds()
            # Kept by the old agent (a background command) until that agent is killed.
            assert _run(old, f"sleep {mark} >/dev/null 2>&1 &", background=True)[0] == 0
            assert isinstance(old, AgentTransport)
            old_pid = old.agent_pid
            assert mark in _in_container(client, permissive, "ps", "-eo", "args=")
            assert _run(new, "true")[0] == 0  # its start kills the old agent and its tree
            listing = _in_container(client, permissive, "ps", "-eo", "pid=,stat=,args=")
            live = [line.split() for line in listing.splitlines() if not line.split()[1].startswith("Z")]
            assert not [fields for fields in live if mark in fields]
            assert str(old_pid) not in [fields[0] for fields in live]
        finally:
            new.close()
            old.close()


@pytest.mark.parametrize("permissive", RUNC_ONLY, indirect=True)
def test_a_replacement_agent_gets_the_word_and_the_protected_list(
    docker_backend: DockerBackend, permissive: str
) -> None:
    transport = _transport(docker_backend._client, permissive, setid_allowed=True)
    assert isinstance(transport, AgentTransport)
    try:
        assert _run(transport, "true")[0] == 0
        first = _hello(transport)
        assert transport._last is not None
        transport._last.close("the test gave it up")  # the next command starts a new agent
        code, output = _run(transport, SETID_SCRIPT)
        second = _hello(transport)
        assert second["pid"] != first["pid"] and transport.agents_started == 2
        assert second["protected"] == first["protected"]  # read from its argv, after the word
        assert second["setid"] == "allowed"
        assert (code, output.count("6755")) == (0, 2), output
    finally:
        transport.close()


# -- the hardened container: the opt-in weakens nothing there ---------------------------------------------
def test_in_the_hardened_container_the_profile_still_refuses_and_the_probe_says_so(
    docker_backend: DockerBackend, owned_workspace: Path
) -> None:
    """The project's seccomp profile refuses set-id modes by itself (runc): a channel started without the
    filter there still cannot set them, and a probe that asks for them refuses the sandbox."""
    with docker_backend.session(workspace=owned_workspace) as session:
        transport = _transport(session._client, session.container_id, setid_allowed=True)
        try:
            with pytest.raises(PolicyNotEnforceableError, match="cannot create setuid"):
                verify_from_inside(transport, ENV, "1000:1000", None, setid_allowed=True)
            script = ": >/tmp/s$$; chmod 4755 /tmp/s$$ && echo set; rm -f /tmp/s$$"
            code, output = _run(transport, script, user="1000:1000")
            assert code == 0 and "Operation not permitted" in output and "set" not in output.split(), output
        finally:
            transport.close()
