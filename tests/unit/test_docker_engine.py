"""Choosing the Docker engine (:mod:`adk_sandbox.executor.backends.docker.engine`) and judging owners across
hosts.

Pure logic: environment variables, context metadata on disk, the refusals, and the reaper's rule that a
pid means something only on its own host and pid namespace. The engines themselves are exercised in
tests/integration/test_docker_remote_engine.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from adk_sandbox.executor import _owner
from adk_sandbox.executor.backends.docker import engine as engine_module
from adk_sandbox.executor.backends.docker.engine import (
    DEFAULT_HOST,
    Engine,
    _bridge,
    _TlsEnd,
    engine_from_env,
    resolve_engine,
)
from adk_sandbox.executor.errors import InvalidRequestError


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """Files named as DOCKER_CERT_PATH names them (contents do not matter to the selection)."""
    directory = tmp_path / "certs"
    directory.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (directory / name).write_text(name)
    return directory


def write_context(
    config: Path, name: str, host: str, tls: Path | None = None, *, skip_verify: bool = False
) -> None:
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / digest
    meta.mkdir(parents=True)
    endpoint = {"Host": host, "SkipTLSVerify": skip_verify}
    (meta / "meta.json").write_text(
        json.dumps({"Name": name, "Metadata": {}, "Endpoints": {"docker": endpoint}})
    )
    if tls is not None:
        target = config / "contexts" / "tls" / digest / "docker"
        target.mkdir(parents=True)
        for file in tls.iterdir():
            (target / file.name).write_bytes(file.read_bytes())


def test_no_setting_means_the_local_default_socket(tmp_path: Path) -> None:
    engine = engine_from_env({"DOCKER_CONFIG": str(tmp_path)})
    assert engine.host == DEFAULT_HOST and engine.local and engine.socket_path == "/var/run/docker.sock"


def test_docker_host_with_tls_variables(certs: Path) -> None:
    env = {
        "DOCKER_HOST": "tcp://engine.example:2376",
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(certs),
    }
    engine = engine_from_env(env)
    assert (engine.kind, engine.local, engine.tls_verify) == ("tcp", False, True)
    assert (engine.ca_cert, engine.client_cert, engine.client_key) == (
        certs / "ca.pem", certs / "cert.pem", certs / "key.pem",
    )  # fmt: skip
    tls = engine.client_arguments()["tls"]
    assert (tls.verify, tls.ca_cert, tls.cert) == (
        True,
        str(certs / "ca.pem"),
        (str(certs / "cert.pem"), str(certs / "key.pem")),
    )


def test_docker_host_wins_over_the_current_context(tmp_path: Path) -> None:
    write_context(tmp_path, "elsewhere", "unix:///elsewhere.sock")
    (tmp_path / "config.json").write_text(json.dumps({"currentContext": "elsewhere"}))
    env = {"DOCKER_CONFIG": str(tmp_path), "DOCKER_HOST": "unix:///here.sock"}
    assert engine_from_env(env).host == "unix:///here.sock"
    assert engine_from_env({"DOCKER_CONFIG": str(tmp_path)}).host == "unix:///elsewhere.sock"
    env = {"DOCKER_CONFIG": str(tmp_path), "DOCKER_CONTEXT": "default"}
    assert engine_from_env(env).host == DEFAULT_HOST  # DOCKER_CONTEXT wins over the config file's


def test_a_context_with_tls_files(tmp_path: Path, certs: Path) -> None:
    config = tmp_path / "config"
    write_context(config, "shared", "tcp://10.1.2.3:2376", certs)
    engine = engine_from_env({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "shared"})
    assert engine.context == "shared" and engine.tls_verify and engine.ca_cert is not None
    assert engine.ca_cert.read_text() == "ca.pem"
    assert "context 'shared'" in engine.describe()


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ({"DOCKER_HOST": "tcp://10.1.2.3:2375"}, "TCP without TLS"),
        ({"DOCKER_HOST": "tcp://10.1.2.3:2376", "DOCKER_CERT_PATH": "/x"}, "without DOCKER_TLS_VERIFY"),
        ({"DOCKER_HOST": "http://engine:2375"}, "must start with unix://, tcp:// or ssh://"),
        ({"DOCKER_HOST": "tcp://engine"}, "names no port"),
        ({"DOCKER_CONTEXT": "nonexistent"}, "there is no Docker context 'nonexistent'"),
    ],
)
def test_unusable_engines_are_refused_with_the_reason(
    tmp_path: Path, setup: dict[str, str], reason: str
) -> None:
    with pytest.raises(InvalidRequestError, match=reason):
        engine_from_env({"DOCKER_CONFIG": str(tmp_path), **setup})


def test_a_context_that_skips_certificate_verification_is_refused(tmp_path: Path, certs: Path) -> None:
    write_context(tmp_path, "lax", "tcp://10.1.2.3:2376", certs, skip_verify=True)
    with pytest.raises(InvalidRequestError, match="SkipTLSVerify"):
        engine_from_env({"DOCKER_CONFIG": str(tmp_path), "DOCKER_CONTEXT": "lax"})


def test_plain_tcp_is_allowed_to_loopback_only_and_urls_resolve() -> None:
    assert Engine(host="tcp://127.0.0.1:2375").kind == "tcp"
    assert Engine(host="tcp://localhost:2375").describe() == "tcp://localhost:2375"
    with pytest.raises(ValueError, match="unauthenticated"):
        Engine(host="tcp://192.0.2.1:2375")
    assert resolve_engine("unix:///x.sock") == Engine(host="unix:///x.sock")
    engine = Engine(host="ssh://me@build-host")
    assert resolve_engine(engine) is engine and engine.kind == "ssh" and not engine.local


def test_the_bridge_drains_what_tls_holds_before_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read smaller than a TLS record leaves the rest of it decrypted in pending(), where poll() does not
    see it: the bridge must pass everything on without more bytes arriving (the server then goes quiet)."""
    monkeypatch.setattr(engine_module, "_READ_SIZE", 100)  # records of 1000 bytes: every read is partial
    import ssl  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    subject = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
    command = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "k.pem",
        "-out",
        "c.pem",
    ]
    subprocess.run([*command, "-days", "1", *subject], cwd=tmp_path, check=True, capture_output=True)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    records = [f"{i:04}".encode() * 250 for i in range(20)]
    done = threading.Event()

    def serve() -> None:
        raw, _ = listener.accept()
        with server_context.wrap_socket(raw, server_side=True) as tls:
            for record in records:
                tls.sendall(record)  # one TLS record each
            done.wait(10)  # keep the connection open: no EOF to wake the reader

    threading.Thread(target=serve, daemon=True).start()
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.load_verify_locations(tmp_path / "c.pem")
    raw = socket.create_connection(listener.getsockname(), timeout=5)
    tls = client_context.wrap_socket(raw, server_hostname="localhost")
    local = _bridge(_TlsEnd(tls))
    try:
        local.settimeout(5)
        received = bytearray()
        want = b"".join(records)
        deadline = time.monotonic() + 5
        while len(received) < len(want) and time.monotonic() < deadline:
            received += local.recv(65536)
        assert bytes(received) == want
    finally:
        done.set()
        local.close()
        listener.close()


# -- reaping across hosts ---------------------------------------------------------------------------------
def owner(**changes: str) -> dict[str, str]:
    """Labels of a container whose owner process is gone, made on this host; ``changes`` override."""
    host, namespace = _owner.host()
    labels = {
        _owner.OWNER_PID: "999999",
        _owner.OWNER_START: "1",
        _owner.OWNER_BOOT: _owner.boot_id(),
        _owner.OWNER_HOST: host,
        _owner.OWNER_PIDNS: namespace,
        _owner.EXPIRES: str(int(time.time()) + 3600),
    }
    return labels | changes


def test_a_dead_owner_on_this_host_is_reaped_but_not_one_on_another_host_or_pid_namespace() -> None:
    now = time.time()
    assert _owner.leak_reason(owner(), now) == "its owner process 999999 is gone"
    assert _owner.leak_reason(owner(**{_owner.OWNER_HOST: "another-machine"}), now) is None
    assert _owner.leak_reason(owner(**{_owner.OWNER_PIDNS: "pid:[1]"}), now) is None
    expired = owner(**{_owner.OWNER_HOST: "another-machine", _owner.EXPIRES: "1"})
    assert _owner.leak_reason(expired, now) == "its expiry time has passed"


def test_new_containers_carry_the_owner_host_and_pid_namespace() -> None:
    labels = _owner.owner_labels("abc", 60)
    assert labels[_owner.OWNER_HOST] == socket.gethostname()
    assert labels[_owner.OWNER_PIDNS] == os.readlink("/proc/self/ns/pid")
