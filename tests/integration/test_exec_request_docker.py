"""The widened ExecRequest in Docker sessions, over the agent channel.

argv without a shell, long code, binary stdin, cwd, a user per call (one agent per user, kept running),
and what a hostile command of one user can do to another user's agent. Real engine; bounds are generous
"does not hang" limits, not timings.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, InvalidRequestError, Language, SandboxFailedError
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.transport import MAX_COMMAND_INPUT

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

HOSTILE = "$(id) ; rm -rf x `id` * && echo pwned | cat > y"
BINARY = b"a\0b\xff\xfe\0\n\x80end"
_HEX = " ".join(f"{byte:02x}" for byte in BINARY)


@pytest.fixture
def session(docker_backend: DockerBackend, owned_workspace: Path) -> Iterator[DockerSession]:
    owned_workspace.chmod(0o755)  # as a checkout usually is: other users may enter it
    with docker_backend.session(workspace=owned_workspace) as opened:
        assert opened.channel == "agent"
        yield opened


@pytest.fixture
def agent_session(docker_backend: DockerBackend, owned_workspace: Path) -> Iterator[DockerSession]:
    owned_workspace.chmod(0o755)
    with docker_backend.session(workspace=owned_workspace) as opened:
        yield opened


def _argv(session: DockerSession, *argv: str, **fields: object) -> ExecResult:
    return session.execute(ExecRequest.model_validate({"argv": argv, "timeout": 60, **fields}))


def _sh(session: DockerSession, code: str, **fields: object) -> ExecResult:
    request = {"language": "command", "code": code, "timeout": 60, **fields}
    return session.execute(ExecRequest.model_validate(request))


def _transport(session: DockerSession) -> AgentTransport:
    transport = session._transport
    assert isinstance(transport, AgentTransport)
    return transport


def _agents_in_container(docker_backend: DockerBackend, session: DockerSession) -> dict[int, str]:
    """Every agent process in the container (pid: uid), listed by root from a separate exec."""
    # The name is put together at run time, so this script's own command line does not match it; a Python
    # agent has it after its program, a static one as argv[0] (hence the space put in front).
    script = (
        "n=adk-sandbox; for d in /proc/[0-9]*; do a=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null); "
        'case " $a" in *" $n-agent"*) echo ${d#/proc/} $(stat -c %u $d);; esac; done'
    )
    created = docker_backend._client.api.exec_create(session.container_id, ["sh", "-c", script], user="0:0")
    lines = docker_backend._client.api.exec_start(created["Id"]).decode().splitlines()
    return {int(pid): uid for pid, uid in (line.split() for line in lines)}


# -- argv --------------------------------------------------------------------------------------------


def test_argv_is_not_interpreted_by_a_shell(session: DockerSession, owned_workspace: Path) -> None:
    (owned_workspace / "x").mkdir()
    result = _argv(session, "printf", "%s|", HOSTILE, "*", "$HOME")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{HOSTILE}|*|$HOME|"
    assert (owned_workspace / "x").is_dir()
    assert not (owned_workspace / "y").exists()


def test_argv_missing_program_is_exit_127(session: DockerSession) -> None:
    result = _argv(session, "adk-no-such-program")
    assert result.exit_code == 127
    assert "adk-no-such-program" in result.stderr or "No such file" in result.stderr


def test_an_argv_of_300_kib_travels_whole(session: DockerSession) -> None:
    # Three arguments of 100 KiB: the whole argv is far beyond one argument's limit.
    pieces = ["a" * 102400, "b" * 102400, "c" * 102400]
    result = _argv(session, "sh", "-c", 'printf %s "$@" | sha256sum', "sh", *pieces)
    assert result.stdout.split()[0] == hashlib.sha256("".join(pieces).encode()).hexdigest(), result.stderr


def test_one_argument_over_linux_limit_is_refused_clearly(session: DockerSession) -> None:
    with pytest.raises(InvalidRequestError, match=r"argv\[1\] is 307200 bytes.*'docker'.*stdin"):
        _argv(session, "echo", "x" * 300 * 1024)


@pytest.mark.parametrize("language", [Language.COMMAND, Language.PYTHON])
def test_code_of_300_kib_runs(session: DockerSession, language: Language) -> None:
    padding = "p" * (300 * 1024)
    code = {
        Language.COMMAND: f'x={padding}; echo "${{#x}}" "$#"',
        Language.PYTHON: f"import sys\nx = '{padding}'\nprint(len(x), sys.argv, __name__)",
    }[language]
    result = session.execute(ExecRequest(language=language, code=code, timeout=60))
    assert result.exit_code == 0, result.stderr[-2000:]
    expected = {Language.COMMAND: f"{len(padding)} 0\n", Language.PYTHON: f"{len(padding)} ['-c'] __main__\n"}
    assert result.stdout == expected[language]


def test_code_beyond_the_inline_limit_is_refused_with_a_hint(session: DockerSession) -> None:
    with pytest.raises(InvalidRequestError, match="write it to a file"):
        _sh(session, "#" * (2 * 1024 * 1024))


# -- stdin -------------------------------------------------------------------------------------------


def test_bytes_stdin_round_trips_unchanged(session: DockerSession) -> None:
    result = _argv(session, "od", "-An", "-v", "-tx1", stdin=BINARY)
    assert " ".join(result.stdout.split()) == _HEX, result.stderr
    assert _argv(session, "cat", stdin=BINARY).stdout == BINARY.decode(errors="replace")


def test_a_mebibyte_of_random_bytes_reaches_the_command_intact(session: DockerSession) -> None:
    data = os.urandom(1024 * 1024)
    result = _argv(session, "sha256sum", stdin=data)
    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest(), result.stderr


def test_stdin_larger_than_the_agent_holds_is_refused_not_cut_short(agent_session: DockerSession) -> None:
    """The sandbox's agent ends a command's input once 256 MiB wait unread: on d163729 a slow reader got
    part of its stdin and exit 0, nothing said. Now refused before anything is sent; at the limit it all
    arrives."""
    over = bytes(MAX_COMMAND_INPUT + 1)
    with pytest.raises(InvalidRequestError, match="256 MiB"):
        _sh(agent_session, "sleep 3; wc -c", stdin=over)
    assert _sh(agent_session, "sleep 1; wc -c", stdin=bytes(32 * 1024 * 1024)).stdout.strip() == str(32 << 20)


# -- cwd ---------------------------------------------------------------------------------------------


def test_cwd_is_used_for_the_call(session: DockerSession, owned_workspace: Path) -> None:
    sub = owned_workspace / "sub dir"
    sub.mkdir()
    os.chown(sub, 1000, 1000)
    assert _argv(session, "pwd", cwd=str(sub)).stdout == f"{sub}\n"
    assert _sh(session, "pwd", cwd="/usr/share").stdout == "/usr/share\n"  # outside the workspace: fine
    assert _sh(session, "touch made-here", cwd="/tmp").exit_code == 0
    assert _argv(session, "ls", "/tmp/made-here").exit_code == 0
    assert _argv(session, "pwd").stdout == f"{owned_workspace}\n"  # the default again


def test_a_cwd_the_user_cannot_enter_is_refused(session: DockerSession, owned_workspace: Path) -> None:
    for cwd, why in (("/no/such/dir", "can't cd"), ("/root", "can't cd"), ("/etc/passwd", "can't cd")):
        with pytest.raises(InvalidRequestError, match="is not a directory the command can enter") as info:
            _argv(session, "touch", str(owned_workspace / "ran"), cwd=cwd)
        assert repr(cwd) in str(info.value)
        assert why in str(info.value)
    assert not (owned_workspace / "ran").exists()
    # As root (the container's, without capabilities... but it owns /root) the same cwd is fine.
    assert _argv(session, "pwd", cwd="/root", user="0:0").stdout == "/root\n"


def test_a_default_cwd_closed_to_the_calls_user_is_refused(
    session: DockerSession, owned_workspace: Path
) -> None:
    owned_workspace.chmod(0o700)  # only its owner (the session's default user) may enter it
    with pytest.raises(InvalidRequestError, match="user 2000:2000 cannot enter the session's working dir"):
        _argv(session, "id", user="2000")
    assert _argv(session, "id", "-u", user="2000", cwd="/").stdout == "2000\n"
    assert _argv(session, "id", "-u").stdout == "1000\n"


# -- user --------------------------------------------------------------------------------------------


def test_the_user_of_one_call(session: DockerSession) -> None:
    assert _argv(session, "id", "-u").stdout == "1000\n"  # the workspace owner by default
    assert _argv(session, "id", user="2000:3000").stdout.startswith("uid=2000 gid=3000 ")
    assert _argv(session, "id", user="2001").stdout.startswith("uid=2001 gid=2001 ")  # never group 0
    assert _argv(session, "id", "-u", user="0").stdout == "0\n"
    assert _argv(session, "id", "-u").stdout == "1000\n"
    assert session.restarts == 0


def test_alternating_users_keep_one_running_agent_each(
    docker_backend: DockerBackend, agent_session: DockerSession
) -> None:
    session = agent_session
    transport = _transport(session)
    seen: dict[str, set[int]] = {"1000:1000": set(), "2000:2000": set()}
    for _ in range(3):
        for user in ("1000:1000", "2000:2000"):
            result = _argv(session, "sh", "-c", "id -u; echo $PPID", user=user)
            assert result.stdout.split()[0] == user.split(":")[0], result.stderr
            seen[user].add(transport.agent_pids[user])
    assert transport.agents_started == 2  # one per user, each started once
    assert session.restarts == 0  # a user switch is not a restart
    assert all(len(pids) == 1 for pids in seen.values())
    running = _agents_in_container(docker_backend, session)
    assert {pid for pids in seen.values() for pid in pids} <= set(running)
    assert sorted(running.values()) == ["1000", "2000"]


def test_same_uid_with_another_gid_replaces_that_agent_without_a_restart(
    agent_session: DockerSession,
) -> None:
    session = agent_session
    transport = _transport(session)
    assert _argv(session, "id", "-g", user="2000:2000").stdout == "2000\n"
    assert _argv(session, "id", "-g", user="2000:5").stdout == "5\n"
    assert set(transport.agent_pids) == {"1000:1000", "2000:5"}  # 1000's from the session's start
    assert _argv(session, "id", "-g", user="2000:2000").stdout == "2000\n"
    assert session.restarts == 0


def test_a_hostile_user_cannot_touch_another_users_agent(
    docker_backend: DockerBackend, agent_session: DockerSession
) -> None:
    session = agent_session
    transport = _transport(session)
    assert _argv(session, "true").exit_code == 0
    victim = transport.agent_pids["1000:1000"]
    attack = (
        f"kill -9 {victim}; kill -STOP {victim}; cat /proc/{victim}/environ; ls /proc/{victim}/fd; echo done"
    )
    result = _sh(session, attack, user="2000:2000")
    assert result.stdout.endswith("done\n")
    assert "Operation not permitted" in result.stderr or "Permission denied" in result.stderr
    # Killing everything it may signal, it kills only its own agent (its end is then unknown).
    with pytest.raises(SandboxFailedError):
        _sh(session, "kill -9 -1; sleep 5", user="2000:2000")
    # The victim's agent is untouched: same pid, no restart, it still runs the default user's commands.
    assert _argv(session, "id", "-u").stdout == "1000\n"
    assert transport.agent_pids["1000:1000"] == victim
    assert victim in _agents_in_container(docker_backend, session)
    assert session.restarts == 0


def test_a_user_killing_its_own_agent_restarts_only_that_one(agent_session: DockerSession) -> None:
    session = agent_session
    transport = _transport(session)
    assert _argv(session, "true", user="2000:2000").exit_code == 0
    other = transport.agent_pids["2000:2000"]
    with pytest.raises(SandboxFailedError):  # its own agent died: the command's end is unknown
        _sh(session, f"kill -9 {transport.agent_pids['1000:1000']}; sleep 5")
    assert _argv(session, "id", "-u").stdout == "1000\n"
    assert session.restarts == 1
    assert transport.agent_pids["2000:2000"] == other
    assert _argv(session, "id", "-u", user="2000:2000").stdout == "2000\n"
    assert session.restarts == 1


def test_an_idle_agent_is_kept(agent_session: DockerSession) -> None:
    # Each user's agent may sit idle while others work. Its reader once shared the socket timeout the last
    # write set (the command's deadline plus grace, here about 6 s), so an idle agent "broke" and was
    # replaced on its user's next command.
    session = agent_session
    transport = _transport(session)
    assert session.execute(ExecRequest(argv=("true",), timeout=1)).exit_code == 0
    pid = transport.agent_pids["1000:1000"]
    time.sleep(8)
    assert _argv(session, "id", "-u").stdout == "1000\n"
    assert transport.agent_pids["1000:1000"] == pid
    assert session.restarts == 0


def test_a_deadline_passing_during_the_cwd_check_is_a_timeout_result(agent_session: DockerSession) -> None:
    # A new user's agent starts first (slow: its sweep retries on the other agents it may not signal),
    # so the cwd check runs out of the call's second: that is the call timing out, not a bad cwd.
    result = _argv(agent_session, "id", "-u", user="3333", cwd="/tmp", timeout=1)
    assert result.timed_out or result.stdout == "3333\n"
    assert _argv(agent_session, "id", "-u", user="3333", cwd="/tmp").stdout == "3333\n"


def test_two_users_at_once_each_get_their_own_agent(agent_session: DockerSession) -> None:
    session = agent_session
    assert _argv(session, "true", user="2000").exit_code == 0  # both agents running
    results: dict[str, ExecResult] = {}

    def run_as(user: str) -> None:
        results[user] = _sh(session, "sleep 1; id -u", user=user)

    threads = [threading.Thread(target=run_as, args=(user,)) for user in ("1000", "2000") * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert {user: result.stdout for user, result in results.items()} == {"1000": "1000\n", "2000": "2000\n"}
    assert session.restarts == 0
    assert _transport(session).agents_started == 2


def test_the_throw_away_container_of_backend_execute_takes_user_and_cwd(
    docker_backend: DockerBackend,
) -> None:
    result = docker_backend.execute(
        ExecRequest(argv=("sh", "-c", "id -u; pwd"), user="4321", cwd="/usr", timeout=60)
    )
    assert result.stdout == "4321\n/usr\n", result.stderr
