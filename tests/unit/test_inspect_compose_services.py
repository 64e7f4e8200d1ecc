"""Compose files of several services: which ports each exposes, start-up order, the links' names, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from adk_sandbox.devtools.adapters.inspect_compose import compose_services
from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxServices, _start_order, resolve_sample

COMPOSE = """\
x-adk-sandbox:
  network: {allow: [pypi.org]}
services:
  db:
    image: db-image
    expose: ["5432"]
  api:
    image: api-image
    command: ["python3", "-m", "http.server", "8000"]
    ports: ["127.0.0.1:18000:8000/tcp", {target: 8001}]
    depends_on:
      db: {condition: service_started}
  default:
    image: agent-image
    command: tail -f /dev/null
    depends_on: [api]
    x-adk-sandbox: {runtime: runsc}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    return path


def test_several_services_are_read_default_first_then_in_start_up_order(tmp_path: Path) -> None:
    path = _write(tmp_path, COMPOSE)
    services = compose_services(yaml.safe_load(COMPOSE), path)
    assert [service.name for service in services] == ["default", "db", "api"]
    default, db, api = services
    assert default.default and default.command is None and default.ports == ()
    assert default.depends_on == ("api",)
    assert db.ports == (5432,) and api.ports == (8000, 8001)
    assert api.command == ("python3", "-m", "http.server", "8000") and api.depends_on == ("db",)
    config = resolve_sample(str(path))
    assert isinstance(config, AdkSandboxServices)
    assert list(config.services) == ["default", "db", "api"]
    assert _start_order(config) == ["db", "api", "default"]
    default_config = config.services["default"].config
    # Each service's own name is its loopback; a sibling's is the address the sibling listens for.
    assert default_config.extra_hosts == {"default": "127.0.0.1", "db": "127.0.0.3", "api": "127.0.0.4"}
    assert config.services["api"].config.extra_hosts["default"] == "127.0.0.2"
    assert default_config.env["NO_PROXY"] == "localhost,127.0.0.1,default,db,api"
    # The top-level x-adk-sandbox is every service's; a service's own is applied over it.
    assert default_config.runtime == "runsc" and config.services["db"].config.runtime == "runc"
    assert all(s.config.network == default_config.network for s in config.services.values())
    assert default_config.network and default_config.network.allow == ("pypi.org",)  # type: ignore[union-attr]


def test_the_default_service_is_marked_or_the_first(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    two: dict[str, dict[str, object]] = {"a": {"image": "x"}, "b": {"image": "y", "x-default": True}}
    assert compose_services({"services": two}, path)[0].name == "b"
    two["b"].pop("x-default")
    assert compose_services({"services": two}, path)[0].name == "a"


@pytest.mark.parametrize(
    ("services", "named"),
    [
        ({"default": {"image": "x"}, "a": {"image": "y", "depends_on": ["nope"]}}, "'nope'"),
        (
            {"default": {"image": "x", "depends_on": ["a"]}, "a": {"image": "y", "depends_on": ["default"]}},
            "cycle",
        ),
        (
            {
                "default": {"image": "x"},
                "a": {"image": "y", "depends_on": {"default": {"condition": "service_healthy"}}},
            },
            "service_started",
        ),
        (
            {"default": {"image": "x", "expose": [80]}, "a": {"image": "y", "ports": ["8080:80"]}},
            "both expose port 80",
        ),
        ({"default": {"image": "x"}, "a": {"image": "y", "ports": ["53/udp"]}}, "53/udp"),
        ({"default": {"image": "x"}, "a": {"image": "y", "healthcheck": {"test": "true"}}}, "'healthcheck'"),
        ({"default": {"image": "x"}, "a": {"image": "y", "networks": ["back"]}}, "'networks'"),
        ({"default": {"image": "x", "command": "python3 -m http.server"}, "a": {"image": "y"}}, "keep-alive"),
        ({"default": {"image": "x"}, "a": {"image": "y", "command": []}}, "`command`"),
    ],
)
def test_what_cannot_be_honoured_is_refused(tmp_path: Path, services: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match="compose file") as raised:
        compose_services({"services": services}, _write(tmp_path, ""))
    assert named in str(raised.value)
