"""The task profile's pure parts: its settings, its container shape, its checks, how its root is capped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from adk_sandbox.executor._owner import PROJECT_LABEL
from adk_sandbox.executor.backends.docker._daemon import remove_container
from adk_sandbox.executor.backends.docker._rootcap import MEMORY_OVERLAY, root_cap_for, size_refusal
from adk_sandbox.executor.backends.docker._seccomp import profile_option
from adk_sandbox.executor.backends.docker._spec import (
    TASK_CAPABILITIES,
    ContainerSpec,
    capabilities_from_inspect,
    hardening_violations,
    host_config_arguments,
)
from adk_sandbox.executor.backends.docker.config import DEFAULT_ROOT_MB, DockerConfig, config_from_options
from adk_sandbox.executor.errors import InvalidRequestError, PolicyNotEnforceableError
from adk_sandbox.executor.policy import SandboxPolicy
from adk_sandbox.executor.types import Language, ResourceLimits
from tests.unit.test_docker_spec import LIMITS, hardened_inspect

WRITABLE = SandboxPolicy.builder().allow_process_spawn().allow_read_write("/tmp").build()
FORBIDDEN = {"SYS_ADMIN", "SYS_PTRACE", "SYS_MODULE", "NET_ADMIN", "NET_RAW", "MKNOD"}


def task_inspect(**host: Any) -> dict[str, Any]:
    base = {"ReadonlyRootfs": False, "CapAdd": list(TASK_CAPABILITIES),
            "SecurityOpt": ["no-new-privileges", profile_option(task=True)]}  # fmt: skip
    return hardened_inspect(**{**base, **host})


def test_the_default_profile_stays_hardened() -> None:
    config = DockerConfig()
    assert config.profile == "hardened" and config.root_cap_mb is None
    assert DockerConfig(profile="task").root_cap_mb == DEFAULT_ROOT_MB
    assert DockerConfig(profile="task", root_size_mb=64).root_cap_mb == 64


def test_the_task_container_is_writable_with_a_few_capabilities_and_network_off() -> None:
    spec = ContainerSpec(image="i", limits=LIMITS, profile="task", root_cap="watched", root_size_mb=64)
    arguments = host_config_arguments(spec)
    assert arguments["read_only"] is False
    assert arguments["cap_drop"] == ["ALL"] and set(arguments["cap_add"]) == set(TASK_CAPABILITIES)
    assert not set(arguments["cap_add"]) & FORBIDDEN
    assert arguments["security_opt"] == ["no-new-privileges", profile_option(task=True)]
    assert arguments["network_mode"] == "none" and arguments["pids_limit"] == 100
    assert "storage_opt" not in arguments  # watched, not a quota
    quota = host_config_arguments(ContainerSpec(image="i", limits=LIMITS, profile="task", root_cap="quota",
                                                root_size_mb=64))  # fmt: skip
    assert quota["storage_opt"] == {"size": "64M"}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, None),
        ({"CapAdd": ["CHOWN"]}, None),
        ({"CapAdd": ["CAP_SYS_ADMIN"]}, "capabilities are added: ['SYS_ADMIN']"),
        ({"CapAdd": [*TASK_CAPABILITIES, "NET_RAW"]}, "capabilities are added: ['NET_RAW']"),
        ({"CapDrop": []}, "not all dropped"),
        ({"SecurityOpt": ["no-new-privileges", profile_option()]}, "not the sandbox's"),
        ({"SecurityOpt": ["no-new-privileges"]}, "Docker's default"),
        ({"SecurityOpt": [profile_option(task=True)]}, "no-new-privileges is not set"),
        ({"NetworkMode": "bridge"}, "network is 'bridge'"),
        ({"Privileged": True}, "privileged"),
    ],
)
def test_task_hardening_is_checked_as_strictly(change: dict[str, Any], problem: str | None) -> None:
    found = hardening_violations(task_inspect(**change), limits=LIMITS, task=True)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


def test_a_hardened_check_refuses_the_task_shape() -> None:
    found = hardening_violations(task_inspect(), limits=LIMITS)
    assert any("capabilities are added" in p for p in found)
    assert any("root filesystem is writable" in p for p in found)


def test_capabilities_say_the_profile_and_how_the_root_is_capped() -> None:
    task = capabilities_from_inspect(task_inspect(), (Language.COMMAND,), root_cap="watched")
    assert (task.profile, task.root_cap, task.fs_write) == ("task", "watched", True)
    uncapped = capabilities_from_inspect(task_inspect(), (Language.COMMAND,))
    assert uncapped.fs_write is False  # a writable root with no cap is not confined
    hardened = capabilities_from_inspect(hardened_inspect(), (Language.COMMAND,), root_cap="watched")
    assert (hardened.profile, hardened.root_cap, hardened.fs_write) == ("hardened", None, True)


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"root_size_mb": 64}, InvalidRequestError, "hardened profile's root is read-only"),
        ({"profile": "task", "container": "c"}, InvalidRequestError, "attached container"),
        ({"profile": "task", "workspace_transport": "bind"}, InvalidRequestError, "only as a copy"),
        ({"profile": "task", "root_size_mb": 0}, InvalidRequestError, "root_size_mb must be"),
        ({"profile": "task", "root_size_mb": "64"}, InvalidRequestError, "root_size_mb must be"),
        ({"profile": "vm"}, InvalidRequestError, "profile"),
        ({"user": "a b"}, InvalidRequestError, "user"),
        ({"profile": "task", "policy": WRITABLE}, PolicyNotEnforceableError, "read-write"),
    ],
)  # fmt: skip
def test_what_the_task_profile_cannot_go_with_is_refused(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        config_from_options(options)


def test_read_only_policy_paths_and_user_names_are_fine() -> None:
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read("/tmp").build()
    assert config_from_options({"profile": "task", "policy": policy, "user": "app:app"}).user == "app:app"


def _info(
    runsc_args: list[str] | None = None, driver: str = "overlay2", backing: str = "extfs"
) -> dict[str, Any]:
    runtimes: dict[str, dict[str, Any]] = {"runc": {"path": "runc"}}
    if runsc_args is not None:
        runtimes["runsc"] = {"path": "/usr/bin/runsc", "runtimeArgs": runsc_args}
    return {"Runtimes": runtimes, "Driver": driver, "DriverStatus": [["Backing Filesystem", backing]]}


NO_PQUOTA = "--storage-opt is supported only for overlay over xfs with 'pquota' mount option"


class SizeAsked:
    """A ``size_refused`` answer that records each size it was asked about."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.asked: list[int] = []

    def __call__(self, size_mb: int) -> str | None:
        self.asked.append(size_mb)
        return self.refusal


def test_how_the_root_is_capped_on_each_engine() -> None:
    limits = ResourceLimits(memory_mb=512)
    takes = SizeAsked()
    assert root_cap_for(_info(), None, limits, 100, explicit=True, size_refused=takes) == ("watched", 100)
    assert root_cap_for(_info(driver="btrfs", backing="btrfs"), None, limits, 100, explicit=True,
                        size_refused=takes) == ("watched", 100)  # fmt: skip
    assert takes.asked == []  # asked only where a quota may hold: overlay2 on XFS
    assert root_cap_for(_info(backing="xfs"), None, limits, 100, explicit=True, size_refused=takes) == (
        "quota", 100,
    )  # fmt: skip
    assert takes.asked == [100]
    memory = _info(["--network=none", MEMORY_OVERLAY])
    assert root_cap_for(memory, "runsc", limits, 4096, explicit=False, size_refused=takes) == ("memory", 512)
    assert root_cap_for(memory, "runsc", limits, 1024, explicit=True, size_refused=takes) == ("memory", 512)
    assert takes.asked == [100]


def test_xfs_without_project_quotas_falls_back_to_the_watch(caplog: pytest.LogCaptureFixture) -> None:
    """An XFS data root mounted without pquota: the engine refuses the size option, so no quota is used."""
    refuses = SizeAsked(NO_PQUOTA)
    cap = root_cap_for(_info(backing="xfs"), None, ResourceLimits(), 64, explicit=True, size_refused=refuses)
    assert cap == ("watched", 64)
    assert refuses.asked == [64]
    assert "pquota" in caplog.text and "watched" in caplog.text


class FakeApi:
    """docker-py's low-level API, as far as :func:`size_refusal` uses it."""

    def __init__(self, errors: dict[str, Exception], images: list[str]) -> None:
        self.errors = errors
        self.image_ids = images
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.removed: list[str] = []

    def create_host_config(self, **options: Any) -> dict[str, Any]:
        return options

    def images(self, quiet: bool = False) -> list[str]:
        return self.image_ids

    def create_container(self, image: str, command: list[str], **options: Any) -> dict[str, str]:
        self.created.append((image, options))
        if image in self.errors:
            raise self.errors[image]
        return {"Id": f"probe-of-{image}"}

    def remove_container(self, container: str, force: bool = False) -> None:
        assert force
        self.removed.append(container)


def _client(errors: dict[str, Exception], images: list[str] | None = None) -> Any:
    return SimpleNamespace(api=FakeApi(errors, images or []))


def test_the_size_probe_creates_one_labelled_container_and_removes_it() -> None:
    client = _client({})
    assert size_refusal(client, "task:1", 64) is None
    ((image, options),) = client.api.created
    assert image == "task:1"
    assert options["host_config"]["storage_opt"] == {"size": "64M"}
    assert options["host_config"]["network_mode"] == "none"
    assert options["labels"][PROJECT_LABEL] == "adk-sandbox"  # reaped if this process dies before remove
    assert client.api.removed == ["probe-of-task:1"]


def test_the_size_probe_reports_the_engines_refusal() -> None:
    refused = docker.errors.APIError("500 Server Error", explanation=NO_PQUOTA)
    client = _client({"task:1": refused})
    assert size_refusal(client, "task:1", 64) == NO_PQUOTA
    assert client.api.removed == []


def test_the_size_probe_uses_another_image_when_the_tasks_is_missing() -> None:
    missing = docker.errors.ImageNotFound("No such image: task:1")
    client = _client({"task:1": missing}, images=["sha256:other"])
    assert size_refusal(client, "task:1", 64) is None
    assert [image for image, _ in client.api.created] == ["task:1", "sha256:other"]
    nothing = _client({"task:1": missing})
    assert "task:1 is missing" in str(size_refusal(nothing, "task:1", 64))


def test_gvisor_without_the_memory_overlay_or_below_the_memory_limit_is_refused() -> None:
    limits = ResourceLimits(memory_mb=512)
    with pytest.raises(PolicyNotEnforceableError, match="uncapped file on the host"):
        root_cap_for(
            _info(["--network=none"]), "runsc", limits, 4096, explicit=False, size_refused=SizeAsked()
        )
    with pytest.raises(PolicyNotEnforceableError, match="memory_mb=100"):
        root_cap_for(_info([MEMORY_OVERLAY]), "runsc", limits, 100, explicit=True, size_refused=SizeAsked())


class RemovingApi:
    """An engine that auto-removes a killed container: a remove gets 409, and it is listed for a while."""

    def __init__(self, listed_for: int) -> None:
        self.inspections = 0
        self.listed_for = listed_for

    def remove_container(self, container: str, force: bool = False, v: bool = False) -> None:
        response = SimpleNamespace(status_code=409, reason="Conflict")
        raise docker.errors.APIError("removal of container is already in progress", response)  # type: ignore[arg-type]

    def inspect_container(self, container: str) -> dict[str, Any]:
        self.inspections += 1
        if self.inspections > self.listed_for:
            raise docker.errors.NotFound("no such container")
        return {"Id": container}


def test_a_removal_the_engine_already_started_is_waited_for() -> None:
    """The root-size watcher kills a container that auto_remove then removes: close() returns once it is gone
    (it returned at the 409 before, and the container was still listed; failed in CI)."""
    api = RemovingApi(listed_for=3)
    remove_container(SimpleNamespace(api=api), "c1")  # type: ignore[arg-type]
    assert api.inspections == 4
