"""A NetworkPolicy on the host ProcessBackend: bwrap's arguments, the refusals, the setting, the two ends.

The forwarder (``executor/network/inside_forward.py``) and the host's endpoint (``unix_endpoint.py``) are
run here on the host itself, with real sockets and no sandbox; ``tests/integration/test_bwrap_egress.py``
runs them under the real bubblewrap.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from adk_sandbox.executor import (
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxPolicy,
    bwrap_arguments,
)
from adk_sandbox.executor.backends import process
from adk_sandbox.executor.backends.bwrap import BubblewrapEnforcer
from adk_sandbox.executor.backends.enforcer import Confinement, Enforcer
from adk_sandbox.executor.backends.process import ProcessBackend, find_system_python
from adk_sandbox.executor.network import ConnectionLog, NetworkPolicy
from adk_sandbox.executor.network.inside_forward import proxy_environment
from adk_sandbox.executor.network.unix_endpoint import (
    FORWARDER_NAME,
    OVER_LIMIT_RULE,
    SOCKET_NAME,
    CommandEgress,
    UnixEndpoint,
    forwarder_source,
)
from tests.conftest import require

SCRATCH = "/tmp/adk-sandbox-scratch"
EGRESS = "/tmp/adk-egress-abc"
POLICY = NetworkPolicy(allow=["allowed.test"], hosts={"allowed.test": ["127.0.0.1"]})
FORWARDER = str(Path(process.__file__).resolve().parents[1] / "network" / "inside_forward.py")


def _spawning(**kwargs: object) -> SandboxPolicy:
    return SandboxPolicy.model_validate({"allow_process_spawn": True, **kwargs})


def _index(args: list[str], run: list[str]) -> int:
    for i in range(len(args) - len(run) + 1):
        if args[i : i + len(run)] == run:
            return i
    raise AssertionError(f"{run} not in {args}")


# -- bwrap's arguments ---------------------------------------------------------------------------------------
def test_egress_directory_is_bound_read_only_after_scratch_and_network_stays_unshared() -> None:
    args = bwrap_arguments(_spawning(), workdir=SCRATCH, scratch_dir=SCRATCH, egress_dir=EGRESS)
    assert "--unshare-net" in args
    bound = _index(args, ["--ro-bind", EGRESS, EGRESS])
    assert bound > _index(args, ["--bind", SCRATCH, SCRATCH])  # on top of a scratch dir, never under it
    assert bound < _index(args, ["--remount-ro", "/"])
    assert ["--bind", EGRESS, EGRESS] not in [args[i : i + 3] for i in range(len(args))]


def test_no_egress_directory_without_a_policy() -> None:
    args = bwrap_arguments(_spawning(), workdir=SCRATCH, scratch_dir=SCRATCH)
    assert not any("adk-egress" in arg for arg in args)


def test_egress_directory_with_a_route_out_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="route out"):
        bwrap_arguments(
            _spawning(allow_network=True), workdir=SCRATCH, scratch_dir=SCRATCH, egress_dir=EGRESS
        )


def test_wrap_passes_the_egress_directory_on() -> None:
    enforcer = BubblewrapEnforcer("/usr/bin/bwrap")
    argv = enforcer.wrap(
        ["/bin/true"],
        policy=_spawning(),
        workdir=SCRATCH,
        scratch_dir=SCRATCH,
        runtime_paths=(),
        egress_dir=EGRESS,
    )
    assert argv[0] == "/usr/bin/bwrap"
    assert argv[-2:] == ["--", "/bin/true"]
    _index(argv, ["--ro-bind", EGRESS, EGRESS])


# -- where a policy is refused -------------------------------------------------------------------------------
class _OtherEnforcer(Enforcer):
    """An enforcer that confines everything but has no way to carry a network policy."""

    name = "other"

    def check_policy(self, policy: SandboxPolicy) -> None:
        del policy

    def confinement(self, policy: SandboxPolicy) -> Confinement:
        del policy
        return Confinement(network=True, fs_read=True, fs_write=True, pids=True)

    def wrap(
        self,
        argv: Sequence[str],
        *,
        policy: SandboxPolicy,
        workdir: str,
        scratch_dir: str,
        runtime_paths: Sequence[str],
        egress_dir: str | None = None,
    ) -> list[str]:
        return list(argv)


def test_a_policy_without_an_enforcer_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="needs an enforcer"):
        ProcessBackend(network=POLICY)


def test_a_policy_with_another_enforcer_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="the other enforcer cannot carry a NetworkPolicy"):
        ProcessBackend.with_sandbox(_OtherEnforcer(), _spawning(), network=POLICY)


def test_a_policy_with_a_sandbox_policy_allowing_network_is_refused() -> None:
    with pytest.raises(PolicyNotEnforceableError, match="give one or the other"):
        ProcessBackend.with_sandbox(
            BubblewrapEnforcer("/usr/bin/bwrap"), _spawning(allow_network=True), network=POLICY
        )


def test_a_policy_without_a_system_python_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "SYSTEM_PYTHONS", ("/nonexistent/python3",))
    with pytest.raises(PolicyNotEnforceableError, match="system's Python 3"):
        ProcessBackend.with_sandbox(BubblewrapEnforcer("/usr/bin/bwrap"), _spawning(), network=POLICY)


def test_the_system_python_must_be_visible_in_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = find_system_python()
    require(real is not None, "a system python3 is needed")
    assert real is not None
    # The same interpreter under a path the sandbox does not show (like a venv's or pyenv's) does not count.
    (tmp_path / "python3").symlink_to(real)
    monkeypatch.setattr(process, "SYSTEM_PYTHONS", (str(tmp_path / "python3"), real))
    assert find_system_python() == real
    monkeypatch.setattr(process, "SYSTEM_PYTHONS", (str(tmp_path / "python3"),))
    assert find_system_python() is None


# -- the setting ---------------------------------------------------------------------------------------------
def test_a_mapping_is_validated_into_a_policy() -> None:
    backend = ProcessBackend.with_sandbox(
        BubblewrapEnforcer("/usr/bin/bwrap"),
        _spawning(),
        network={"allow": ["allowed.test"], "hosts": {"allowed.test": ["127.0.0.1"]}},
    )
    assert backend.network == POLICY
    assert backend.egress == POLICY
    assert backend.policy.allow_network is False  # no route out
    assert backend.network_log().entries == ()


@pytest.mark.parametrize(
    ("network", "match"),
    [
        ("yes", "network must be False, True or a NetworkPolicy"),
        (1, "network must be False, True or a NetworkPolicy"),
        ({"allow": ["10.0.0.1"]}, "network: not a NetworkPolicy: allow"),
        ({"allow": ["a.test"], "bogus": 1}, "network: not a NetworkPolicy: bogus"),
    ],
)
def test_anything_else_is_refused(network: object, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        ProcessBackend(network=network)  # type: ignore[arg-type]


def test_true_is_the_policys_allow_network_and_false_leaves_it() -> None:
    enforcer = BubblewrapEnforcer("/usr/bin/bwrap")
    open_ = ProcessBackend.with_sandbox(enforcer, _spawning(), network=True)
    assert open_.policy.allow_network is True
    assert open_.network is True
    assert "--unshare-net" not in bwrap_arguments(open_.policy, workdir=SCRATCH, scratch_dir=SCRATCH)
    closed = ProcessBackend.with_sandbox(enforcer, _spawning())
    assert closed.network is False
    assert "--unshare-net" in bwrap_arguments(closed.policy, workdir=SCRATCH, scratch_dir=SCRATCH)
    assert ProcessBackend.with_sandbox(enforcer, _spawning(allow_network=True)).network is True
    # Without an enforcer nothing is confined either way, as before: there is a route out.
    assert ProcessBackend(network=True).capabilities().network is False
    assert ProcessBackend(network=False).network is True


def test_capabilities_name_the_policy_in_force() -> None:
    backend = ProcessBackend.with_sandbox(BubblewrapEnforcer("/usr/bin/bwrap"), _spawning(), network=POLICY)
    capabilities = backend.capabilities()
    assert capabilities.network is True  # no route out: only the proxy reaches what the policy allows
    assert capabilities.network_policy == POLICY
    plain = ProcessBackend.with_sandbox(BubblewrapEnforcer("/usr/bin/bwrap"), _spawning())
    assert plain.capabilities().network_policy is None


# -- the forwarder, run on the host --------------------------------------------------------------------------
def _forward(tmp_path: Path, *command: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    python = find_system_python() or sys.executable
    return subprocess.run(
        [python, "-I", "-S", FORWARDER, str(tmp_path / "absent.sock"), *command],
        input=stdin,
        capture_output=True,
        timeout=30,
        check=False,
    )


def test_forwarder_gives_the_proxy_variables_and_passes_streams_through(tmp_path: Path) -> None:
    done = _forward(
        tmp_path, "/bin/sh", "-c", 'cat; echo "$HTTPS_PROXY $no_proxy" >&2; exit 7', stdin=b"in\n"
    )
    assert done.returncode == 7
    assert done.stdout == b"in\n"
    url, local = done.stderr.decode().split()
    assert url.startswith("http://127.0.0.1:")
    assert proxy_environment(int(url.rsplit(":", 1)[1]))["HTTPS_PROXY"] == url
    assert local == "localhost,127.0.0.1"


def test_forwarder_exits_as_a_shell_for_a_killed_child(tmp_path: Path) -> None:
    assert _forward(tmp_path, "/bin/sh", "-c", "kill -9 $$").returncode == 128 + 9
    missing = _forward(tmp_path, "/nonexistent/program")
    assert missing.returncode == 127
    assert b"/nonexistent/program" in missing.stderr


def test_forwarder_closes_a_connection_the_host_does_not_take(tmp_path: Path) -> None:
    # The socket does not exist: the client sees its connection end, nothing more.
    code = (
        "import os, socket; p = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])\n"
        "s = socket.create_connection(('127.0.0.1', p))\n"
        "s.settimeout(10)\n"
        "try:\n"
        "    s.sendall(b'GET http://a.test/ HTTP/1.1\\r\\n\\r\\n'); print(repr(s.recv(100)))\n"
        "except ConnectionResetError:\n"  # closed at once, the request unread: a reset is a close too
        "    print(repr(b''))"
    )
    done = _forward(tmp_path, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == b"b''"


def test_forwarder_source_is_this_module() -> None:
    assert forwarder_source() == Path(FORWARDER).read_bytes()


# -- the host's endpoint -------------------------------------------------------------------------------------
def _wait(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def _pass_client(path: str) -> socket.socket:
    """A loopback TCP connection whose accepted end is passed to the endpoint at ``path`` (as the forwarder).

    Returns the client's end (the forwarder's copies are closed, as it closes them).
    """
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    with accepted, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.connect(path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # turned away (over the bound)
            socket.send_fds(unix, [b"\0"], [accepted.fileno()])
    return client


def test_endpoint_refuses_by_rule_and_logs(tmp_path: Path) -> None:
    log = ConnectionLog()
    endpoint = UnixEndpoint(str(tmp_path / "e.sock"), POLICY, log)
    try:
        client = _pass_client(endpoint.path)
        client.sendall(b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        client.settimeout(10)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 403")
        assert b"no rule allows it" in answer
    finally:
        endpoint.close()
    assert [(e.host, e.decision, e.rule) for e in log.entries()] == [
        ("denied.test", "refused", "no rule allows it")
    ]
    assert not os.path.exists(endpoint.path)


def test_endpoint_bounds_live_connections_and_closes_them_at_the_end(tmp_path: Path) -> None:
    log = ConnectionLog()
    endpoint = UnixEndpoint(str(tmp_path / "e.sock"), POLICY, log, max_connections=3)
    clients = []
    try:
        for _ in range(10):
            clients.append(_pass_client(endpoint.path))
        _wait(lambda: endpoint.live == 3 and endpoint.turned_away == 7)
    finally:
        endpoint.close()
    assert endpoint.live == 0
    for client in clients:  # every one ended: the three served ones by close(), mid-head
        client.settimeout(5)
        assert client.recv(100) == b""
        client.close()
    rules = [entry.rule for entry in log.entries()]
    assert rules.count("closed") == 3
    assert rules[-1] == OVER_LIMIT_RULE
    assert "7 connections" in log.entries()[-1].detail


def test_command_egress_directory_is_private_and_removed(tmp_path: Path) -> None:
    with CommandEgress(POLICY, ConnectionLog(), parent=str(tmp_path)) as egress:
        assert os.stat(egress.directory).st_mode & 0o777 == 0o700
        assert sorted(os.listdir(egress.directory)) == sorted([FORWARDER_NAME, SOCKET_NAME])
        assert egress.env == {}
        assert egress.prefix("/usr/bin/python3") == [
            "/usr/bin/python3", "-I", "-S", egress.forwarder_path, egress.socket_path,
        ]  # fmt: skip
    assert not os.path.exists(egress.directory)


def test_a_long_temporary_directory_falls_back_to_tmp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with CommandEgress(POLICY, ConnectionLog()) as egress:
        assert os.path.dirname(egress.directory) == "/tmp"
        assert os.path.exists(egress.socket_path)


def test_set_network_is_refused_clearly() -> None:
    backend = ProcessBackend.with_sandbox(BubblewrapEnforcer("/usr/bin/bwrap"), _spawning(), network=POLICY)
    with pytest.raises(PolicyNotEnforceableError, match="cannot change its network at run time"):
        backend.set_network(False)
    assert backend.network == POLICY
