"""Single-service compose files read into the inspect provider's config: every key honoured or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from adk_sandbox.devtools.adapters.inspect_compose import compose_fields, is_compose
from adk_sandbox.devtools.adapters.inspect_sandbox import AdkSandboxConfig, ImageBuild, resolve_config
from adk_sandbox.executor.network.policy import NetworkPolicy

FULL = """\
services:
  default:
    build:
      context: task
      dockerfile: Dockerfile.task
      args: [VERSION=3]
      network: host
    image: my-task:1
    user: app:app
    working_dir: /testbed
    environment:
      - GREETING=hi
      - FROM_HOST
      - NOT_SET_ANYWHERE
    init: true
    command: ["tail", "-f", "/dev/null"]
    mem_limit: 1.5g
    cpus: 1.5
    network_mode: none
    x-default: true
    x-local: true
    x-adk-sandbox: {runtime: runsc, limits: {pids: 64}}
x-anchors: &anchor {a: 1}
version: "3"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "task").mkdir(exist_ok=True)
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    return path


def test_every_listed_key_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_HOST", "host-value")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = _write(tmp_path, FULL.replace("mem_limit: 1.5g", "mem_limit: 1536m"))
    config = resolve_config(str(path))
    assert config.image == "my-task:1"
    assert config.build == ImageBuild(
        context=str((tmp_path / "task").resolve()), dockerfile="Dockerfile.task", args={"VERSION": "3"},
        network="host",
    )  # fmt: skip
    assert (config.user, config.working_dir, config.network, config.runtime) == (
        "app:app",
        "/testbed",
        False,
        "runsc",
    )
    assert config.env == {"GREETING": "hi", "FROM_HOST": "host-value"}  # a bare unset key is left out
    assert (config.limits.memory_mb, config.limits.cpus, config.limits.pids) == (1536, 1.5, 64)
    assert config.profile == "task"  # the provider's default


def test_a_build_without_an_image_gets_a_stable_local_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "services:\n  web:\n    build: task\n")
    first = compose_fields({"services": {"web": {"build": "task"}}}, path)
    assert (
        first["image"].startswith("adk-sandbox-task/") and first["image"] == resolve_config(str(path)).image
    )
    other = tmp_path / "other"
    other.mkdir()
    assert compose_fields({"services": {"web": {"build": "other"}}}, path)["image"] != first["image"]


@pytest.mark.parametrize(
    ("service", "named"),
    [
        ({"image": "x", "privileged": True}, "'privileged'"),
        ({"image": "x", "volumes": ["./src:/src"]}, "'volumes'"),
        ({"image": "x", "healthcheck": {"test": ["CMD", "true"]}}, "'healthcheck'"),
        ({"image": "x", "ports": ["8000-8010:80-90"]}, "8000-8010:80-90"),
        ({"image": "x", "network_mode": "bridge"}, "network_mode: bridge"),
        ({"image": "x", "init": False}, "init: False"),
        ({"image": "x", "command": "python3 -m http.server"}, "python3 -m http.server"),
        ({"image": "x", "mem_limit": "lots"}, "mem_limit: lots"),
        ({"build": {"context": "task", "target": "dev"}}, "'target'"),
        ({"build": "missing-dir"}, "is not a directory"),
        ({"user": "root"}, "needs `image` or `build`"),
        ({"image": "x", "x-adk-sandbox": "runsc"}, "x-adk-sandbox"),
    ],
)
def test_a_key_that_cannot_be_honoured_is_refused_by_name(
    tmp_path: Path, service: dict[str, object], named: str
) -> None:
    path = _write(tmp_path, "")
    with pytest.raises(ValueError, match="service 'default'") as raised:
        compose_fields({"services": {"default": service}}, path)
    assert named in str(raised.value)


def test_keep_alive_commands_are_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    for command in ("tail -f /dev/null", "sleep infinity", ["sleep", "3600"], "sh -c 'tail -f /dev/null'"):
        compose_fields({"services": {"default": {"image": "x", "command": command}}}, path)


def test_several_services_and_unknown_top_level_keys_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    with pytest.raises(ValueError, match=r"has 2 services: read it with compose_services"):
        compose_fields({"services": {"default": {"image": "x"}, "db": {"image": "postgres"}}}, path)
    with pytest.raises(ValueError, match="'networks'"):
        compose_fields({"services": {"default": {"image": "x"}}, "networks": {}}, path)
    with pytest.raises(ValueError, match="map service names"):
        compose_fields({"services": {}}, path)


def test_an_invalid_field_value_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "services:\n  default:\n    image: x\n    x-adk-sandbox: {profile: open}\n")
    with pytest.raises(ValueError, match=r"(?s)compose file .*compose.yaml.*profile"):
        resolve_config(str(path))


def test_only_a_services_mapping_makes_a_compose_file() -> None:
    assert is_compose({"services": {}}) and not is_compose({"image": "x"}) and not is_compose([1])


def test_working_dir_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        AdkSandboxConfig(working_dir="testbed")


def test_a_dockerfile_path_is_built_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM adk-sandbox/base:latest\n")
    config = resolve_config(str(tmp_path / "Dockerfile"))
    assert config.build == ImageBuild(context=str(tmp_path.resolve()), dockerfile="Dockerfile")
    assert config.image.startswith("adk-sandbox-task/") and config.profile == "task"


def test_a_network_policy_from_yaml_a_compose_file_and_the_model(tmp_path: Path) -> None:
    policy = NetworkPolicy(allow=["pypi.org", "*.pythonhosted.org"], hosts={"git.test": ["127.0.0.1"]})
    fields = tmp_path / "adk-sandbox.yaml"
    fields.write_text(
        'network:\n  allow: [pypi.org, "*.pythonhosted.org"]\n  hosts: {git.test: [127.0.0.1]}\n'
    )
    assert resolve_config(str(fields)).network == policy
    path = _write(
        tmp_path,
        "services:\n  default:\n    image: x\n    network_mode: none\n    x-adk-sandbox:\n      network:\n"
        '        allow: [pypi.org, "*.pythonhosted.org"]\n        hosts: {git.test: [127.0.0.1]}\n',
    )
    config = resolve_config(str(path))
    assert config.network == policy
    assert hash(config) == hash(resolve_config(str(path)))  # inspect keys its caches by the config
    assert AdkSandboxConfig(network=policy).network is policy
    assert AdkSandboxConfig(network=True).network is True


@pytest.mark.parametrize(
    ("network", "message"),
    [("yes", "network must be false, true or a NetworkPolicy"), ({"allow": ["10.0.0.1"]}, "IP address")],
)
def test_a_network_that_is_neither_a_bool_nor_a_policy_is_refused(network: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdkSandboxConfig(network=network)
