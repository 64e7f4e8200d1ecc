"""``DockerConfig``: the checked settings of a ``DockerBackend`` (no engine: every check here refuses
before the backend would connect, which an unreachable ``DOCKER_HOST`` makes sure of)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pydantic import ValidationError

from adk_sandbox.executor import DockerBackend, InvalidRequestError, PolicyNotEnforceableError, ResourceLimits
from adk_sandbox.executor.backends.docker import DockerConfig, PoolConfig
from adk_sandbox.executor.backends.docker.config import DEFAULT_LIFETIME_SECONDS
from adk_sandbox.executor.errors import BackendUnavailableError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import SandboxPolicy

SPAWN = SandboxPolicy.builder().allow_process_spawn()
POLICY = NetworkPolicy(allow=["pypi.org"])


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any backend that got past its checks would fail to connect, not reach a real engine."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/adk-sandbox-test/docker.sock")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)


#: (options, error type, what the message says): what DockerBackend(**options) always refused.
REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"transport": "pigeon"}, InvalidRequestError, "transport must be 'agent' (the default), not 'pigeon'"),
    # The exec transport was removed: said so, with what the one channel needs in the image.
    ({"transport": "exec"}, InvalidRequestError, "transport='exec' was removed"),
    ({"transport": "exec"}, InvalidRequestError, "needs /bin/sh, chmod and an executable /tmp"),
    ({"policy": SandboxPolicy()}, PolicyNotEnforceableError, "cannot forbid spawning processes"),
    ({"lifetime_seconds": 0}, InvalidRequestError, "lifetime_seconds must be positive"),
    ({"workspace_transport": "copy"}, InvalidRequestError, "workspace_transport must be one of auto, bind"),
    ({"mirror_size_mb": 0}, InvalidRequestError, "mirror_size_mb must be an integer from 1 to 65536"),
    ({"mirror_size_mb": True}, InvalidRequestError, "mirror_size_mb must be an integer"),
    ({"mirror_size_mb": "64"}, InvalidRequestError, "mirror_size_mb must be an integer"),
    ({"workspace_transport": "mirror", "container": "svc"}, InvalidRequestError, "an attached container"),
    ({"image_id": "latest"}, InvalidRequestError, "image_id must be an image id"),
    ({"tmpfs": {"/proc/x": 8}}, InvalidRequestError, "overlaps /proc"),
    ({"tmpfs": {"/var/tmp": 0}}, InvalidRequestError, "tmpfs must map absolute paths to sizes"),
    ({"tmpfs": {"/var/tmp": 8}, "container": "svc"}, InvalidRequestError, "tmpfs= applies to containers"),
    ({"labels": {"io.adk-sandbox.session": "x"}}, InvalidRequestError, "project's namespace"),
    ({"labels": {"org.example.a": "b"}, "container": "svc"}, InvalidRequestError, "labels= applies"),
    (
        {"tmpfs": {"/var/tmp": 8}, "policy": SPAWN.allow_read("/var/tmp/data").build()},
        InvalidRequestError,
        "overlaps",
    ),
    ({"pool": 1, "container": "svc"}, InvalidRequestError, "an attached container (container=) is one"),
    ({"network": "yes"}, InvalidRequestError, "network must be False, True or a NetworkPolicy"),
    ({"network": 1}, InvalidRequestError, "network must be False, True or a NetworkPolicy"),
    ({"network": {"allow": ["10.0.0.1"]}}, InvalidRequestError, "is an IP address, not a host name"),
    ({"network": {"alow": ["pypi.org"]}}, InvalidRequestError, "network: not a NetworkPolicy: alow"),
    ({"network": POLICY, "container": "svc"}, PolicyNotEnforceableError, "an attached container"),
    (
        {"network": POLICY, "policy": SPAWN.allow_network().build()},
        PolicyNotEnforceableError,
        "give one or the other",
    ),
    (
        {"pool": PoolConfig(size=1, max_age_seconds=100), "lifetime_seconds": 100},
        InvalidRequestError,
        r"PoolConfig.max_age_seconds (100) must be below lifetime_seconds (100)",
    ),
]


@pytest.mark.parametrize(("options", "error", "message"), REFUSED)
def test_the_backend_refuses_what_it_always_did_before_connecting(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        DockerBackend(**options)
    assert type(refused.value) is error and message in str(refused.value)


@pytest.mark.parametrize(("options", "error", "message"), REFUSED)
def test_the_config_refuses_the_same_with_the_same_message(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    # A ValueError (InvalidRequestError) comes inside pydantic's ValidationError; the policy's own error
    # is not a ValueError and comes as it is.
    expected = ValidationError if issubclass(error, ValueError) else error
    with pytest.raises(expected) as refused:
        DockerConfig(**options)
    assert message in str(refused.value)


def test_a_wrong_type_is_an_invalid_request_naming_the_option() -> None:
    with pytest.raises(InvalidRequestError, match="invalid DockerBackend option: lifetime_seconds"):
        DockerBackend(lifetime_seconds="soon")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match=r"pool\.size"):
        DockerBackend(pool=0)


def test_valid_options_get_as_far_as_connecting() -> None:
    with pytest.raises(BackendUnavailableError):
        DockerBackend(runtime="runsc", tmpfs={"/var/tmp": 8}, pool=2)
    with pytest.raises(BackendUnavailableError):
        DockerBackend(config=DockerConfig(runtime="runsc"))


def test_config_and_keyword_options_do_not_mix() -> None:
    with pytest.raises(InvalidRequestError, match=r"either config= or keyword options.*image, runtime"):
        DockerBackend("other-image", config=DockerConfig(), runtime="runsc")


def test_the_config_holds_every_keyword_option_with_its_default_and_a_docstring() -> None:
    parameters = inspect.signature(DockerBackend.__init__).parameters
    options = {name: p.default for name, p in parameters.items() if name not in ("self", "config")}
    assert set(options) == set(DockerConfig.model_fields) - {"type"}  # type: the union's discriminator
    default = DockerConfig()
    for name, value in options.items():
        if value is not None:
            assert getattr(default, name) == value, name
        assert DockerConfig.model_fields[name].description, f"DockerConfig.{name} has no docstring"
    assert default.limits == ResourceLimits() and default.policy == SandboxPolicy()
    assert default.lifetime_seconds == DEFAULT_LIFETIME_SECONDS
    assert default.tmpfs == {} and default.labels == {} and default.pool is None


def test_the_config_is_frozen_forbids_unknown_fields_and_reads_an_int_pool() -> None:
    config = DockerConfig(pool=3, image_id="ab" * 32)
    assert config.pool == PoolConfig(size=3)
    assert config.pinned_image is not None and config.pinned_image.image_id == "sha256:" + "ab" * 32
    with pytest.raises(ValidationError):
        config.image = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        DockerConfig(imgae="typo")  # type: ignore[call-arg]


def test_network_takes_a_bool_a_policy_or_a_policys_mapping_on_both_paths() -> None:
    assert DockerConfig().network is False and DockerConfig().egress is None
    assert DockerConfig(network=True).network is True and DockerConfig(network=True).egress is None
    mapping = {"allow": ["pypi.org", "*.pythonhosted.org"], "hosts": {"Git.Test": ["127.0.0.1"]}}
    config = DockerConfig(network=mapping)  # as YAML or JSON gives it
    assert isinstance(config.network, NetworkPolicy) and config.egress == config.network
    assert config.egress == NetworkPolicy(
        allow=["pypi.org", "*.pythonhosted.org"], hosts={"git.test": ["127.0.0.1"]}
    )
    assert DockerConfig(network=POLICY).egress is POLICY
    # The keyword path builds the same config (it gets as far as connecting).
    with pytest.raises(BackendUnavailableError):
        DockerBackend(network=POLICY)
    with pytest.raises(BackendUnavailableError):
        DockerBackend(config=DockerConfig(network=POLICY))
