"""``doctor``'s engine and dialect lines (issue 13): the address, local or remote, TLS, the dialect."""

from __future__ import annotations

from pathlib import Path

from adk_sandbox.executor.backends.docker.engine import Engine
from adk_sandbox.executor.cli import engine_lines


def test_a_local_socket_engine_is_named_local() -> None:
    assert [line.split() for line in engine_lines(Engine(), "docker", "(API 1.41)")] == [
        ["engine", "unix", "unix:///var/run/docker.sock", "(local)"],
        ["dialect", "docker", "docker", "(API", "1.41)"],
    ]


def test_a_tls_engine_is_named_remote_over_tls(tmp_path: Path) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    engine = Engine(
        host="tcp://build.example:2376",
        tls_verify=True,
        ca_cert=tmp_path / "ca.pem",
        client_cert=tmp_path / "cert.pem",
        client_key=tmp_path / "key.pem",
        context="builder",
    )
    engine_line, dialect_line = engine_lines(engine, "podman")
    assert engine_line.split() == [
        "engine", "tcp+TLS", "tcp://build.example:2376", "over", "TLS", "(context", "'builder')", "(remote)"
    ]  # fmt: skip
    assert dialect_line.split() == ["dialect", "podman", "podman"]


def test_an_ssh_engine_is_remote() -> None:
    [engine_line, _] = engine_lines(Engine(host="ssh://me@box"), "docker")
    assert engine_line.split() == ["engine", "ssh", "ssh://me@box", "(remote)"]
