"""Any Docker engine (issue 13, step 1): a remote engine over TCP+TLS, and what is refused there.

The remote engine is a private ``dockerd`` (:mod:`tests.integration.private_engine`) listening on TCP
127.0.0.1 with certificates made for this run, in its own mount namespace with a tmpfs over the directory
of this module's workspaces: like an engine on another machine, it cannot see this machine's copy of them.
The base image is loaded into it once (``docker save | docker load``). Commands are found in the host's
/proc by a sleep duration nobody else uses (the engine shares the pid namespace). Nothing is left on
either engine at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, IsolationClass, Language, SandboxFailedError, _owner
from adk_sandbox.executor._owner import PROJECT_LABEL
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, DockerSession, Engine
from adk_sandbox.executor.backends.docker.engine import _ssh_pools
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import SandboxPolicy
from adk_sandbox.executor.workspace.auto import AUTO_CHOICES
from tests.conftest import live_processes_with_args, project_containers, require, unique_sleep_seconds
from tests.integration.egress_servers import BODY, Upstream
from tests.integration.private_engine import (
    DOCKERD,
    PrivateEngine,
    PrivateEngineError,
    PrivateSshd,
    find_sshd,
)
from tests.integration.test_docker_tree_kill import ENDINGS, alive, check_no_descendant_survives
from tests.loopback_server import stop_serving

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Generous "does not hang" bound.
QUICK = 30.0


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the remote engine sees as an empty tmpfs; this module's workspaces live in it."""
    return tmp_path_factory.mktemp("hidden-from-engine")


@pytest.fixture(scope="module")
def remote(docker_backend: DockerBackend, hidden: Path) -> Iterator[PrivateEngine]:
    """The private engine over TCP+TLS with the base image, for this module; removed at the end."""
    require(os.geteuid() == 0 and os.access(DOCKERD, os.X_OK), f"a private dockerd needs root and {DOCKERD}")
    local_before = set(project_containers(docker_backend._client, os.getpid()))
    engine = PrivateEngine(tls=True, hide=hidden, data_in_memory=True)
    try:
        engine.start()
        engine.load_image(BASE_IMAGE)
    except (PrivateEngineError, subprocess.CalledProcessError) as exc:
        engine.destroy()
        require(False, f"the private Docker engine could not start: {exc}")
    try:
        yield engine
        assert engine.containers() == [], "a container was left on the remote engine"
        # Nothing of this module ran on the local engine.
        assert set(project_containers(docker_backend._client, os.getpid())) <= local_before
    finally:
        engine.destroy()
        assert engine.leftover_processes() == []


@contextlib.contextmanager
def started_sshd(remote: PrivateEngine, max_sessions: int = 10) -> Iterator[PrivateSshd]:
    """Debian's sshd on 127.0.0.1 forwarding to the remote engine (``docker system dial-stdio``)."""
    binary = find_sshd()
    require(binary is not None, "no sshd: scripts/setup unpacks Debian's openssh-server")
    assert binary is not None
    directory = Path(tempfile.mkdtemp(prefix="adk-sshd-", dir="/tmp"))
    daemon = PrivateSshd(binary, directory, remote.host, max_sessions=max_sessions)
    try:
        daemon.start()
    except PrivateEngineError as exc:
        shutil.rmtree(daemon.directory, ignore_errors=True)
        require(False, f"sshd could not start: {exc}")
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(daemon.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def sshd(remote: PrivateEngine) -> Iterator[PrivateSshd]:
    """The module's sshd, with sshd's default ``MaxSessions`` (10)."""
    with started_sshd(remote) as daemon:
        yield daemon


@pytest.fixture
def over_ssh(sshd: PrivateSshd, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """The remote engine over ssh; HOME holds the client's key and known hosts (paramiko reads them there)."""
    monkeypatch.setenv("HOME", str(sshd.home))
    return Engine(host=sshd.host)


@pytest.fixture(scope="module")
def backend(remote: PrivateEngine) -> Iterator[DockerBackend]:
    with DockerBackend(engine=remote.engine()) as opened:
        yield opened


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object) -> ExecResult:
    request = ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, cwd="/tmp")
    return session.execute(request, **kwargs)  # type: ignore[arg-type]


def in_container(backend: DockerBackend, session: DockerSession, *argv: str) -> str:
    """Output of an exec as root outside the session (docker-py over the same TLS engine)."""
    created = backend._client.api.exec_create(session.container_id, list(argv), user="0:0")
    return backend._client.api.exec_start(created["Id"]).decode()


# -- a session over TLS -----------------------------------------------------------------------------------
def test_a_session_over_tls_is_hardened_reports_inspect_and_uses_the_agent(
    backend: DockerBackend, remote: PrivateEngine
) -> None:
    assert not backend.engine.local and backend.engine.tls_verify
    with backend.session() as session:  # its start ran the hardening and set-id probe in the container
        assert session.container_id in remote.containers()
        capabilities = session.capabilities()
        assert capabilities.channel == session.channel == "agent"
        assert capabilities.isolation is IsolationClass.CONTAINER == session.isolation()
        assert (capabilities.memory, capabilities.cpu, capabilities.pids, capabilities.network) == (
            True, True, True, True,
        )  # fmt: skip
        assert capabilities.fs_read and capabilities.fs_write
        inspect = remote.client().api.inspect_container(session.container_id)
        assert inspect["HostConfig"]["CapDrop"] == ["ALL"] and inspect["HostConfig"]["NetworkMode"] == "none"
        # What the probe checks, seen by a command: no set-id file, no capability, another machine's view.
        result = run(session, 'f=$(mktemp); chmod 4755 "$f" && echo setid; grep CapEff /proc/self/status')
        assert "setid" not in result.stdout and "0000000000000000" in result.stdout


def test_big_output_and_stdin_cross_the_tls_stream_whole(remote: PrivateEngine) -> None:
    stdin = os.urandom(1 << 20).hex()  # 2 MB in, 2 MB back: TLS records beyond one read, and back-pressure
    with DockerBackend(engine=remote.engine()) as backend, backend.session() as session:
        result = session.execute(
            ExecRequest(
                argv=("sh", "-c", "cat; head -c 3000000 /dev/zero | tr '\\0' x"),
                stdin=stdin,
                timeout=60,
                max_output_bytes=8 << 20,
            )
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout == stdin + "x" * 3000000
        assert session.channel == "agent"


FETCH = """
import socket, sys, urllib.request
print(urllib.request.urlopen('http://allowed.test:{port}/', timeout=20).read().decode(), end='')
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=5)  # the client's loopback, straight
    print('ESCAPED')
except OSError as error:
    print('no route:', error)
"""


def test_egress_under_a_policy_leaves_from_the_client_over_the_tls_stream(remote: PrivateEngine) -> None:
    """Issue 23 on a remote engine: a sandbox reaches a server on the *client's* loopback, by its policy.

    The server listens on 127.0.0.1 of this machine, which a container of the engine cannot reach by any
    route (its network is ``none``); the bytes arrive only because the agent's proxy endpoint carries the
    connection over the engine's TLS stream to the relay in this process.
    """
    upstream = Upstream()
    policy = NetworkPolicy(allow=[f"allowed.test:{upstream.port}"], hosts={"allowed.test": ["127.0.0.1"]})
    try:
        with DockerBackend(engine=remote.engine(), network=policy) as backend, backend.session() as session:
            assert session.capabilities().network_policy == policy
            code = FETCH.replace("{port}", str(upstream.port))
            result = session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))
            assert result.exit_code == 0, result.stderr
            assert result.stdout.startswith(BODY.decode()) and "no route:" in result.stdout, result.stdout
            assert len(upstream.received) == 1 and upstream.received[0].startswith(b"GET / HTTP/1.1")
            (entry,) = session.network_log().entries
            assert (entry.host, entry.decision, entry.port) == ("allowed.test", "allowed", upstream.port)
            inspect = remote.client().api.inspect_container(session.container_id)
            assert inspect["HostConfig"]["NetworkMode"] == "none"
    finally:
        upstream.close()


def check_tree_kill(backend: DockerBackend, session: DockerSession, ending: str) -> None:
    """The matrix case ``ending`` on a remote engine (the bomb's file looked for over the same engine)."""
    check_no_descendant_survives(
        backend,
        session,
        ending,
        run,
        bomb_went_off=lambda: (
            "yes" in in_container(backend, session, "sh", "-c", "test -e /tmp/bomb && echo yes")
        ),
    )


@pytest.mark.parametrize("ending", ENDINGS)
def test_tree_kill_matrix_over_tls(backend: DockerBackend, ending: str) -> None:
    with backend.session() as session:
        check_tree_kill(backend, session, ending)


def test_requests_ca_bundle_does_not_replace_the_engine_ca(
    remote: PrivateEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bogus = tmp_path / "bogus-ca.pem"
    bogus.write_text("not a certificate\n")
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.setenv(name, str(bogus))
    with DockerBackend(engine=remote.engine()) as backend, backend.session() as session:
        assert run(session, "echo fine").stdout == "fine\n"


# -- choosing the engine: environment and contexts --------------------------------------------------------
def test_docker_host_with_tls_variables_and_a_context_pick_the_remote_engine(
    remote: PrivateEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert remote.tls_dir is not None
    monkeypatch.setenv("DOCKER_HOST", remote.tcp_host)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(remote.tls_dir))
    with DockerBackend() as backend, backend.session() as session:
        assert backend.engine.host == remote.tcp_host and backend.engine.tls_verify
        assert session.container_id in remote.containers()
    # The same engine as a Docker context (the metadata `docker context create` writes).
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name)
    config = tmp_path / "docker-config"
    digest = hashlib.sha256(b"shared").hexdigest()
    (config / "contexts" / "meta" / digest).mkdir(parents=True)
    endpoint = {"Host": remote.tcp_host, "SkipTLSVerify": False}
    meta = {"Name": "shared", "Metadata": {}, "Endpoints": {"docker": endpoint}}
    (config / "contexts" / "meta" / digest / "meta.json").write_text(json.dumps(meta))
    tls = config / "contexts" / "tls" / digest / "docker"
    tls.mkdir(parents=True)
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tls / name).write_bytes((remote.tls_dir / name).read_bytes())
    (config / "config.json").write_text(json.dumps({"currentContext": "shared"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    with DockerBackend() as backend, backend.session() as session:
        assert backend.engine.context == "shared"
        assert session.container_id in remote.containers()
        assert run(session, "echo via-context").stdout == "via-context\n"


# -- host paths on an engine that cannot see them ---------------------------------------------------------
def test_a_host_workspace_travels_to_a_remote_engine_as_a_mirror_over_tls(
    backend: DockerBackend, remote: PrivateEngine, hidden: Path
) -> None:
    workspace = hidden / "ws-mirror"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the host's copy\n")
    (workspace / "gone.txt").write_text("delete me\n")
    outside = hidden / "outside-tls"
    outside.mkdir()
    with backend.session(workspace=workspace) as session:
        assert session.workspace_transport == "mirror" and session.capabilities().workspace == "mirror"
        result = run(session, f"cd {workspace} && cat notes.txt && echo made > made.txt && rm gone.txt && "
                     f"ln -s {outside} out && mkfifo fifo && head -c 65536 /dev/urandom > rand.bin && "
                     "md5sum rand.bin | cut -c1-32")  # fmt: skip
        assert result.stdout.startswith("the host's copy\n"), result.stderr
        assert (workspace / "made.txt").read_text() == "made\n" and not (workspace / "gone.txt").exists()
        digest = hashlib.md5((workspace / "rand.bin").read_bytes()).hexdigest()  # noqa: S324
        assert digest == result.stdout.split()[-1]
        assert not (workspace / "out").is_symlink() and not (workspace / "fifo").exists()
        # Many files over TLS: 2,000 made in the container, changed later, all back.
        run(session, f"cd {workspace} && mkdir many && for i in $(seq 2000); do echo $i > many/$i; done")
        assert len(list((workspace / "many").iterdir())) == 2000
        (workspace / "many" / "7").write_text("host edit\n")
        assert run(session, f"cat {workspace}/many/7").stdout == "host edit\n"
        bomb = run(session, f"dd if=/dev/zero of={workspace}/bomb bs=1M count=2000 2>&1; echo done")
        assert "No space left on device" in bomb.stdout
    assert list(outside.iterdir()) == []
    assert (workspace / "bomb").stat().st_size <= backend.mirror_size_mb * 1024 * 1024
    assert remote.containers() == []


def test_bind_forced_or_policy_paths_are_refused_on_a_remote_engine(
    remote: PrivateEngine, hidden: Path
) -> None:
    workspace = hidden / "ws-refused"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the host's copy\n")
    before = remote.containers()
    with (
        DockerBackend(engine=remote.engine(), workspace_transport="bind") as forced,
        pytest.raises(PolicyNotEnforceableError) as refused,
    ):
        forced.session(workspace=workspace)
    message = str(refused.value)
    assert str(workspace) in message and "not on this machine" in message and "Nothing ran" in message
    assert "workspace_transport='mirror'" in message  # what to do instead
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read(str(hidden)).build()
    with (
        DockerBackend(engine=remote.engine(), policy=policy) as with_policy,
        pytest.raises(PolicyNotEnforceableError, match="cannot mount"),
    ):
        with_policy.session()
    assert remote.containers() == before  # refused before anything was created


def test_a_local_socket_engine_with_other_files_at_the_path_gets_a_mirror_or_refuses_a_forced_bind(
    remote: PrivateEngine, hidden: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through its Unix socket the engine counts as local, so the bind is tried: the engine's own (different)
    # directory at the same path is mounted, and the probe file written here is not in it.
    workspace = hidden / "ws-split"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the host's copy\n")
    assert remote.process is not None
    inside = ["nsenter", f"--mount=/proc/{remote.process.pid}/ns/mnt", "mkdir", "-p", str(workspace / ".git")]
    subprocess.run(inside, check=True)
    monkeypatch.setenv("DOCKER_HOST", remote.host)
    with (
        DockerBackend(workspace_transport="bind") as forced,
        pytest.raises(PolicyNotEnforceableError, match="a probe file written here is not there"),
    ):
        assert forced.engine.local
        forced.session(workspace=workspace).start()
    # auto: the identity check (per path: this one is hidden from the engine) fails, so it is mirrored.
    AUTO_CHOICES.clear()  # this test counts the checks
    tried: list[str | None] = []
    open_once = DockerSession._open_once

    def counted(self: DockerSession, mode: str | None) -> None:
        tried.append(mode)
        open_once(self, mode)

    monkeypatch.setattr(DockerSession, "_open_once", counted)
    with DockerBackend() as backend, backend.session(workspace=workspace) as session:
        assert session.workspace_transport == "mirror" and session.capabilities().workspace == "mirror"
        echoed = run(session, f"cat {workspace}/notes.txt; echo back > {workspace}/back.txt")
        assert echoed.stdout == "the host's copy\n"
    assert (workspace / "back.txt").read_text() == "back\n"
    assert tried == ["bind", "mirror"]  # the bind was tried, failed its check, then the mirror
    # The failed check is remembered for this engine and directory: no second bind, in any backend.
    with DockerBackend() as again:
        with again.session(workspace=workspace) as second:
            assert second.workspace_transport == "mirror"
        assert again.capabilities().workspace == "auto"  # decided per workspace on a local engine
        assert again.capabilities(workspace=workspace).workspace == "mirror"  # from what was found
        assert again.capabilities(workspace=str(workspace) + "/.").workspace == "mirror"  # same directory
        # A directory not checked yet: the identity check alone answers (no mirror is pushed for it).
        other = hidden / "ws-split-other"
        other.mkdir()
        assert again.capabilities(workspace=other).workspace == "mirror"
        with again.session(workspace=other) as third:
            assert third.workspace_transport == "mirror"
    checked = [mode for mode in tried if mode is not None]  # None: the workspace-less probe session
    assert checked == ["bind", "mirror", "mirror", "bind", "mirror"]
    assert remote.containers() == []


# -- reaping across hosts ---------------------------------------------------------------------------------
def test_other_hosts_containers_are_reaped_by_expiry_only(remote: PrivateEngine) -> None:
    client = remote.client()
    # An owner process that is gone (pid 999999 with another start time), not expired, of this boot.
    base = {
        PROJECT_LABEL: "adk-sandbox",
        _owner.OWNER_PID: "999999",
        _owner.OWNER_START: "1",
        _owner.OWNER_BOOT: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        _owner.EXPIRES: "9999999999",
    }
    other_host = {**base, _owner.OWNER_HOST: "another-machine"}
    expired = {**other_host, _owner.EXPIRES: "1"}
    here = {_owner.OWNER_HOST: socket.gethostname(), _owner.OWNER_PIDNS: os.readlink("/proc/self/ns/pid")}
    ours = {**base, **here}
    made = {
        name: client.api.create_container(BASE_IMAGE, ["true"], labels=labels)["Id"]
        for name, labels in (("other", other_host), ("expired", expired), ("ours", ours))
    }
    try:
        with DockerBackend(engine=remote.engine()) as backend:
            reaped = {leaked.id for leaked in backend.reaped}
        assert made["other"] not in reaped  # its owner pid is another machine's: alive for all we know
        assert made["expired"] in reaped
        assert made["ours"] in reaped  # same host and pid namespace: the dead owner pid counts
    finally:
        for container_id in made.values():
            with contextlib.suppress(Exception):
                client.api.remove_container(container_id, force=True)
        client.close()


# -- the connection dropped mid-command -------------------------------------------------------------------
class CuttableProxy:
    """A TCP forwarder to the engine whose connections can all be cut at once (TLS passes through it)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.refusing = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            server = socket.create_connection(self._upstream)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._forward, args=(a, b), daemon=True).start()

    @staticmethod
    def _forward(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Drop every connection (a reset, as a network failure would) and refuse new ones."""
        self.refusing = True
        with self._lock:
            connections, self._open = self._open, []
        for connection in connections:
            with contextlib.suppress(OSError):
                # Linger 0: the close is a reset. The shutdown wakes the forwarding thread blocked in recv
                # (a plain close would leave the connection open until that recv returns).
                connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                connection.shutdown(socket.SHUT_RDWR)
                connection.close()

    def close(self) -> None:
        self.cut()
        stop_serving(self._listener, self._acceptor)


def test_a_connection_dropped_mid_command_fails_it_clearly_and_leaves_no_process(
    remote: PrivateEngine,
) -> None:
    proxy = CuttableProxy(("127.0.0.1", remote.port or 0))
    mark = unique_sleep_seconds()
    try:
        with DockerBackend(engine=remote.engine(f"tcp://127.0.0.1:{proxy.port}")) as backend:
            session = backend.session()
            assert run(session, "echo before").stdout == "before\n"
            errors: list[BaseException] = []
            ended = threading.Event()

            def command() -> None:
                try:
                    run(session, f"sleep {mark}", timeout=120)
                except BaseException as exc:
                    errors.append(exc)
                ended.set()

            threading.Thread(target=command, daemon=True).start()
            deadline = time.monotonic() + QUICK
            while not live_processes_with_args("sleep", mark):
                assert time.monotonic() < deadline, "the command never started"
                time.sleep(0.05)
            cut = time.monotonic()
            proxy.cut()
            assert ended.wait(QUICK), "the command still blocks after the connection dropped"
            assert time.monotonic() - cut < QUICK
            assert len(errors) == 1 and isinstance(errors[0], SandboxFailedError), errors
            assert "not re-run" in str(errors[0])
            # The engine closed the agent's stdin with the connection: the agent killed the command.
            deadline = time.monotonic() + QUICK
            while live_processes_with_args("sleep", mark):
                assert time.monotonic() < deadline, "the command outlived its dropped connection"
                time.sleep(0.1)
            proxy.refusing = False  # the network is back: the session goes on with a new agent
            assert run(session, "echo again").stdout == "again\n"
            assert session.restarts == 1
            assert alive(backend, session, mark) == []
            session.close()
    finally:
        proxy.close()
    assert live_processes_with_args("sleep", mark) == []
    assert remote.containers() == []


# -- over ssh ---------------------------------------------------------------------------------------------
def test_a_session_over_ssh_is_hardened_uses_the_agent_and_mirrors_a_workspace(
    over_ssh: Engine, remote: PrivateEngine, hidden: Path
) -> None:
    with DockerBackend(engine=over_ssh) as backend:
        assert backend.engine.kind == "ssh" and not backend.engine.local
        with backend.session() as session:
            assert session.container_id in remote.containers()
            capabilities = session.capabilities()
            assert capabilities.channel == "agent" and capabilities.isolation is IsolationClass.CONTAINER
            assert capabilities.network and capabilities.memory and capabilities.pids
            stdin = os.urandom(1 << 18).hex()  # 512 KB in and out through paramiko's windows
            result = session.execute(ExecRequest(argv=("cat",), stdin=stdin, timeout=60))
            assert (result.exit_code, result.stdout) == (0, stdin)
        workspace = hidden / "ws-ssh"
        workspace.mkdir()
        (workspace / "in.txt").write_text("over ssh\n")
        with backend.session(workspace=workspace) as mirrored:  # the workspace travels as a mirror
            assert (
                run(mirrored, f"cat {workspace}/in.txt; echo out > {workspace}/out.txt").stdout
                == "over ssh\n"
            )
        assert (workspace / "out.txt").read_text() == "out\n"
    with (
        DockerBackend(engine=over_ssh, workspace_transport="bind") as forced,
        pytest.raises(PolicyNotEnforceableError, match="not on this machine"),
    ):
        forced.session(workspace=workspace)


def test_more_streams_than_one_ssh_connection_allows_are_spread_over_connections(over_ssh: Engine) -> None:
    """sshd allows 10 channels per connection (MaxSessions): twelve open at once, each answering a ping."""
    connections = [over_ssh.dial(30, stream=True) for _ in range(12)]
    ping_all(connections)


def test_a_server_that_allows_fewer_channels_than_we_count_gets_more_connections(
    remote: PrivateEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MaxSessions 2``, below the 8 channels we put on one connection: the third channel is refused.

    The refused connection is marked full and the dial goes over another one, so six streams open at
    once all answer (before the fix the third dial failed with "the ssh server ... refused a channel").
    Only our dialer is under test: docker-py's own paramiko client (the API calls) is not ours, and with
    ``MaxSessions 2`` it fails by itself ("Connect failed").
    """
    with started_sshd(remote, max_sessions=2) as daemon:
        monkeypatch.setenv("HOME", str(daemon.home))
        engine = Engine(host=daemon.host)
        connections = [engine.dial(30, stream=True) for _ in range(6)]
        ping_all(connections)


def test_a_pooled_ssh_connection_that_died_while_idle_is_replaced_on_the_next_dial(
    remote: PrivateEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection the server dropped is only known dead once used: the dial then takes a fresh one.

    Its transport is closed under it, and it is made to look alive to the first check, as a connection
    does between the server's drop and the client's reader seeing it. Before the fix the dial failed with
    "the ssh server ... refused a channel (Channel closed.)", as it did once in CI.
    """
    with started_sshd(remote) as daemon:
        monkeypatch.setenv("HOME", str(daemon.home))
        engine = Engine(host=daemon.host)
        ping_all([engine.dial(30, stream=True)])
        (pooled,) = _ssh_pools[engine.host]
        deadline = time.monotonic() + 30
        while pooled.channels and time.monotonic() < deadline:  # the bridge lets its channel go
            time.sleep(0.01)
        assert pooled.channels == 0, "the first stream's channel was never released"
        pooled.client.get_transport().close()  # the connection is dead...
        looks = iter([True])  # ...but looks alive once (the pool's own check), then as it is
        monkeypatch.setattr(pooled, "active", lambda: next(looks, False))
        ping_all([engine.dial(30, stream=True)])
        assert pooled not in _ssh_pools[engine.host]


def ping_all(connections: list[socket.socket]) -> None:
    """Send every stream the engine's ``/_ping`` at once, then check each answers; close them all."""
    try:
        for connection in connections:
            connection.sendall(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
        for connection in connections:
            connection.settimeout(30)
            assert connection.recv(4096).startswith(b"HTTP/1.1 200 OK")
    finally:
        for connection in connections:
            connection.close()
