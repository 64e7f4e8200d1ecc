"""``_daemon.connect``: the daemon's client does not take proxy or CA settings from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from adk_sandbox.executor.backends.docker import _daemon


def test_the_client_session_ignores_proxy_and_ca_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    socket = tmp_path / "docker.sock"
    socket.touch()  # connect() only checks that it exists; nothing below talks to it
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://garbage.invalid:1")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/nonexistent/ca-bundle.pem")
    negotiated_with: list[bool] = []

    def offline_version(api: Any) -> str:
        # The (absent) daemon's version; asked only once the session ignores the environment: a CA bundle
        # there would replace a TLS engine's own CA for this very first request.
        negotiated_with.append(api.trust_env)
        return "1.41"

    monkeypatch.setattr(docker.APIClient, "_retrieve_server_version", offline_version)
    monkeypatch.setattr(docker.DockerClient, "ping", lambda _self: True)

    client = _daemon.connect()
    try:
        assert negotiated_with == [False]
        assert client.api.api_version == "1.41"
        assert client.api.trust_env is False
        url = client.api.base_url + "/_ping"
        settings = client.api.merge_environment_settings(url, {}, None, None, None)
        assert settings["proxies"] == {}
        assert settings["verify"] is True  # not the garbage REQUESTS_CA_BUNDLE
    finally:
        client.close()
