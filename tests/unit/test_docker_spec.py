"""Pure parts of the Docker backend: the create arguments, the reading of inspect, leaks, the demux."""

from __future__ import annotations

import itertools
import os
import re
import socket
import struct
import time
from typing import Any

import docker.errors
import pytest
import requests

from adk_sandbox.executor._owner import (
    EXPIRES,
    OWNER_BOOT,
    OWNER_PID,
    OWNER_START,
    leak_reason,
    owner_labels,
)
from adk_sandbox.executor.backends.docker import _daemon
from adk_sandbox.executor.backends.docker._exec import DockerStreamSplitter
from adk_sandbox.executor.backends.docker._seccomp import profile_option
from adk_sandbox.executor.backends.docker._spec import (
    ContainerSpec,
    capabilities_from_inspect,
    hardening_violations,
    host_config_arguments,
    tmpfs_overlap,
    validate_labels,
    validate_tmpfs,
)
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    ExecutorError,
    InvalidRequestError,
    SandboxFailedError,
)
from adk_sandbox.executor.types import IsolationClass, Language, ResourceLimits

MIB = 1024 * 1024
LIMITS = ResourceLimits(memory_mb=256, cpus=1.5, pids=100, tmpfs_mb=64, file_size_mb=10, nofile=1024)


def test_host_config_is_hardened_by_default() -> None:
    arguments = host_config_arguments(ContainerSpec(image="img", limits=LIMITS, workspace="/w"))
    assert arguments["network_mode"] == "none"
    assert arguments["cap_drop"] == ["ALL"]
    assert arguments["security_opt"] == ["no-new-privileges", profile_option()]
    assert arguments["cgroupns"] == "private"
    assert arguments["read_only"] is True and arguments["init"] is True
    assert arguments["mem_limit"] == arguments["memswap_limit"] == 256 * MIB
    assert arguments["nano_cpus"] == 1_500_000_000
    assert arguments["pids_limit"] == 100
    assert arguments["tmpfs"] == {
        "/tmp": "rw,exec,nosuid,nodev,size=64m,mode=1777",
        "/home/sandbox": "rw,exec,nosuid,nodev,size=64m,mode=1777",
    }
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in arguments["ulimits"]} == {
        ("nofile", 1024, 1024),
        ("core", 0, 0),
        ("fsize", 10 * MIB, 10 * MIB),
    }
    assert arguments["log_config"]["Type"] == "none"
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in arguments["mounts"]] == [("/w", "/w", False)]


def test_git_protection_mounts_go_read_only_over_the_workspace() -> None:
    spec = ContainerSpec(image="i", limits=LIMITS, workspace="/w", read_only_mounts=("/w/.git/hooks",))
    mounts = [(m["Target"], m["ReadOnly"]) for m in host_config_arguments(spec)["mounts"]]
    assert mounts == [("/w", False), ("/w/.git/hooks", True)]


def test_extra_tmpfs_mounts_are_executable_but_never_set_id_or_devices() -> None:
    spec = ContainerSpec(image="i", limits=LIMITS, extra_tmpfs={"/var/tmp": 32, "/opt/cache": 1})
    tmpfs = host_config_arguments(spec)["tmpfs"]
    assert tmpfs["/var/tmp"] == "rw,exec,nosuid,nodev,size=32m,mode=1777"
    assert tmpfs["/opt/cache"] == "rw,exec,nosuid,nodev,size=1m,mode=1777"
    assert set(tmpfs) == {"/tmp", "/home/sandbox", "/var/tmp", "/opt/cache"}


@pytest.mark.parametrize(
    ("tmpfs", "problem"),
    [
        ({"/var/tmp": 64}, None),
        ({"/var/tmp": 64, "/opt/x": 65536}, None),
        ({"var/tmp": 64}, "absolute and normalised"),
        ({"/var/tmp/": 64}, "absolute and normalised"),
        ({"/var/../etc": 64}, "absolute and normalised"),
        ({"/var/./tmp": 64}, "absolute and normalised"),
        ({"//var/tmp": 64}, "absolute and normalised"),
        ({"/var//tmp": 64}, "absolute and normalised"),
        ({"/var/\0tmp": 64}, "absolute and normalised"),
        ({"/": 64}, "whole image"),
        ({"/proc": 64}, "overlaps /proc"),
        ({"/proc/sys": 64}, "overlaps /proc"),
        ({"/sys/fs/cgroup": 64}, "overlaps /sys"),
        ({"/dev/shm": 64}, "overlaps /dev"),
        ({"/tmp": 64}, "overlaps /tmp"),
        ({"/tmp/x": 64}, "overlaps /tmp"),
        ({"/home": 64}, "overlaps /home/sandbox"),
        ({"/home/sandbox/.cache": 64}, "overlaps /home/sandbox"),
        ({"/var": 64, "/var/tmp": 8}, "inside the tmpfs path '/var'"),
        ({"/var/tmp": 0}, "greater than or equal to 1"),
        ({"/var/tmp": 65537}, "less than or equal to 65536"),
        ({"/var/tmp": "64"}, "valid integer"),
        ({"/var/tmp": 6.5}, "valid integer"),
        ({"/var/tmp": True}, "valid integer"),
        ({f"/t{i}": 1 for i in range(17)}, "at most 16"),
    ],
)
def test_extra_tmpfs_paths_and_sizes_are_validated(tmpfs: dict[str, Any], problem: str | None) -> None:
    if problem is None:
        assert validate_tmpfs(tmpfs) == tmpfs
        return
    with pytest.raises(InvalidRequestError, match=re.escape(problem)) as raised:
        validate_tmpfs(tmpfs)
    assert isinstance(raised.value, ValueError)


def test_extra_tmpfs_may_not_hide_a_host_mount() -> None:
    assert tmpfs_overlap(["/var/tmp"], ["/work/ws", "/data"]) is None
    assert "overlaps the host mount '/work/ws'" in (tmpfs_overlap(["/work"], ["/work/ws"]) or "")
    assert "overlaps the host mount '/work/ws'" in (tmpfs_overlap(["/work/ws/out"], ["/work/ws"]) or "")
    assert tmpfs_overlap(["/work/ws"], ["/work/ws"]) is not None
    assert tmpfs_overlap(["/work/wsx"], ["/work/ws"]) is None  # a sibling with a common prefix


def test_the_tmpfs_mounts_asked_for_are_verified() -> None:
    wanted = {"/tmp": "rw,exec,nosuid,nodev,size=64m,mode=1777", "/var/tmp": "rw,exec,nosuid,nodev,size=8m"}
    inspect = hardened_inspect(Tmpfs=dict(wanted))
    assert hardening_violations(inspect, limits=LIMITS, tmpfs=wanted) == []
    inspect = hardened_inspect(Tmpfs={"/tmp": wanted["/tmp"], "/var/tmp": "rw,exec,size=8m"})
    assert hardening_violations(inspect, limits=LIMITS, tmpfs=wanted) == [
        "the tmpfs /var/tmp is mounted 'rw,exec,size=8m', not 'rw,exec,nosuid,nodev,size=8m'"
    ]
    inspect = hardened_inspect(Tmpfs={"/tmp": wanted["/tmp"]})
    assert hardening_violations(inspect, limits=LIMITS, tmpfs=wanted) == ["the tmpfs /var/tmp is not mounted"]


@pytest.mark.parametrize(
    ("labels", "problem"),
    [
        ({"org.example.eval": "run-1", "task": ""}, None),
        ({"inspect/sample:1": "x" * 4096}, None),
        ({"io.adk-sandbox.session": "forged"}, "in this project's namespace"),
        ({"io.adk-sandbox.owner-pid": "1"}, "in this project's namespace"),
        ({"IO.ADK-SANDBOX.expires": "0"}, "in this project's namespace"),
        ({"": "x"}, "should match pattern"),
        ({"-x": "x"}, "should match pattern"),
        ({"a b": "x"}, "should match pattern"),
        ({"a\nb": "x"}, "should match pattern"),
        ({"k" * 256: "x"}, "should match pattern"),
        ({"k": "x" * 4097}, "at most 4096 characters"),
        ({"k": 1}, "valid string"),
        ({f"k{i}": "" for i in range(65)}, "at most 64 labels"),
    ],
)
def test_user_labels_are_validated_and_never_in_the_projects_namespace(
    labels: dict[str, Any], problem: str | None
) -> None:
    if problem is None:
        assert validate_labels(labels) == labels
        return
    with pytest.raises(InvalidRequestError, match=re.escape(problem)):
        validate_labels(labels)


def test_network_is_only_on_when_asked() -> None:
    assert (
        host_config_arguments(ContainerSpec(image="i", limits=LIMITS, network=True))["network_mode"]
        == "bridge"
    )


def hardened_inspect(**host: Any) -> dict[str, Any]:
    config = {
        "NetworkMode": "none",
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges", profile_option()],
        "MaskedPaths": ["/proc/kcore"],
        "ReadonlyPaths": ["/proc/sys"],
        "CgroupnsMode": "private",
        "ReadonlyRootfs": True,
        "Memory": 256 * MIB,
        "MemorySwap": 256 * MIB,
        "PidsLimit": 100,
        "NanoCpus": 1_500_000_000,
        "Runtime": "runc",
    }
    config.update(host)
    return {"State": {"Running": True}, "HostConfig": config, "Mounts": []}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, None),
        ({"NetworkMode": "bridge"}, "network is 'bridge'"),
        ({"CapDrop": None}, "capabilities are not all dropped"),
        ({"CapAdd": ["NET_ADMIN"]}, "capabilities are added"),
        ({"Privileged": True}, "privileged"),
        ({"SecurityOpt": [profile_option()]}, "no-new-privileges is not set"),
        ({"SecurityOpt": ["no-new-privileges:true", profile_option()]}, None),
        ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "seccomp profile is disabled"),
        ({"SecurityOpt": ["no-new-privileges", "seccomp:unconfined"]}, "seccomp profile is disabled"),
        ({"SecurityOpt": ["no-new-privileges"]}, "Docker's default, which lets commands create setuid"),
        (
            {"SecurityOpt": ["no-new-privileges", 'seccomp={"defaultAction": "SCMP_ACT_ALLOW"}']},
            "not the sandbox's",
        ),
        ({"SecurityOpt": ["no-new-privileges", "seccomp=/some/path.json"]}, "not the sandbox's"),
        ({"SecurityOpt": ["no-new-privileges", profile_option(), "apparmor=unconfined"]}, "AppArmor"),
        ({"SecurityOpt": ["no-new-privileges", profile_option(), "label:disable"]}, "SELinux"),
        ({"MaskedPaths": []}, "not masked"),
        ({"ReadonlyPaths": None}, "not masked"),
        ({"CgroupnsMode": "host"}, "cgroup namespace"),
        ({"OomKillDisable": True}, "OOM killer is disabled"),
        ({"PidMode": "container:other"}, "another container's namespace"),
        ({"ReadonlyRootfs": False}, "root filesystem is writable"),
        ({"PidMode": "host"}, "PidMode shares the host"),
        ({"IpcMode": "host"}, "IpcMode shares the host"),
        ({"Devices": [{"PathOnHost": "/dev/kvm"}]}, "host devices"),
        ({"Memory": 0}, "memory limit is 0"),
        ({"MemorySwap": -1}, "memory+swap is -1"),
        ({"PidsLimit": None}, "pids limit is None"),
        ({"NanoCpus": 0}, "cpu limit is 0"),
    ],
)
def test_hardening_violations_table(change: dict[str, Any], problem: str | None) -> None:
    found = hardening_violations(hardened_inspect(**change), limits=LIMITS)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


def test_a_stopped_container_an_unexpected_mount_or_runtime_are_violations() -> None:
    inspect = hardened_inspect()
    inspect["State"]["Running"] = False
    inspect["Mounts"] = [{"Type": "bind", "Source": "/etc", "Destination": "/etc"}]
    found = hardening_violations(inspect, limits=LIMITS, runtime="runsc", mounts=["/w"])
    assert found == [
        "the container is not running",
        "runtime is 'runc', not 'runsc'",
        "unexpected host mount /etc -> /etc",
    ]


def test_engine_sockets_are_refused_even_read_only_and_even_attached(tmp_path: Any) -> None:
    sock_path = tmp_path / "custom-engine.socket"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        for source, destination in [
            ("/var/run/docker.sock", "/var/run/docker.sock"),
            ("/run", "/host-run"),
            ("/", "/host"),
            (str(sock_path), "/engine"),  # any socket file
            (str(tmp_path), "/x/podman.sock"),  # named like one inside
            (str(tmp_path / "elsewhere"), "/e"),  # the daemon in use (DOCKER_HOST) lives under it
        ]:
            inspect = hardened_inspect()
            inspect["Mounts"] = [{"Type": "bind", "Source": source, "Destination": destination, "RW": False}]
            found = hardening_violations(
                inspect, limits=LIMITS, mounts=[source], attached=True,
                engine_sockets=[str(tmp_path / "elsewhere" / "d.sock")],
            )  # fmt: skip
            assert found and "engine's socket" in found[0], (source, found)
    finally:
        server.close()


def test_attached_extra_mounts_are_allowed_but_reported_as_not_confined() -> None:
    inspect = hardened_inspect()
    inspect["Mounts"] = [
        {"Type": "bind", "Source": "/w", "Destination": "/w", "RW": True},
        {"Type": "bind", "Source": "/etc", "Destination": "/host-etc", "RW": False},
    ]
    assert hardening_violations(inspect, limits=LIMITS, mounts=["/w"], attached=True) == []
    assert hardening_violations(inspect, limits=LIMITS, mounts=["/w"]) == [
        "unexpected host mount /etc -> /host-etc"
    ]
    read_only = capabilities_from_inspect(inspect, (Language.COMMAND,), confined=["/w"])
    assert (read_only.fs_read, read_only.fs_write) == (False, True)
    inspect["Mounts"][1]["RW"] = True
    writable = capabilities_from_inspect(inspect, (Language.COMMAND,), confined=["/w"])
    assert (writable.fs_read, writable.fs_write) == (False, False)
    only_workspace = capabilities_from_inspect(inspect, (Language.COMMAND,), confined=["/w", "/etc"])
    assert only_workspace.fs_read and only_workspace.fs_write


def test_attach_mode_wants_some_limits_not_exact_ones() -> None:
    assert hardening_violations(hardened_inspect(Memory=1, PidsLimit=5), limits=None) == []
    assert hardening_violations(hardened_inspect(Memory=0, PidsLimit=0), limits=None) == [
        "no memory limit",
        "no pids limit",
    ]


def test_capabilities_come_from_the_inspected_container() -> None:
    languages = (Language.COMMAND,)
    runc = capabilities_from_inspect(hardened_inspect(), languages)
    assert runc.isolation is IsolationClass.CONTAINER
    assert runc.network and runc.memory and runc.cpu and runc.pids and runc.fs_write and runc.env
    gvisor = capabilities_from_inspect(hardened_inspect(Runtime="runsc"), languages)
    assert gvisor.isolation is IsolationClass.GVISOR
    open_net = capabilities_from_inspect(hardened_inspect(NetworkMode="bridge", Memory=0), languages)
    assert not open_net.network and not open_net.memory


def test_leak_reasons() -> None:
    mine = owner_labels("s1", 3600)
    assert leak_reason(mine, time.time()) is None  # this very process owns it
    assert leak_reason(mine, time.time() + 7200) == "its expiry time has passed"
    dead = {**mine, OWNER_PID: "999999999", OWNER_START: "1"}
    assert leak_reason(dead, time.time()) == "its owner process 999999999 is gone"
    reused_pid = {**mine, OWNER_PID: "1", OWNER_START: "not-init's-start-time"}
    assert leak_reason(reused_pid, time.time()) == "its owner process 1 is gone"
    other_machine = {**dead, OWNER_BOOT: "another-boot"}
    assert leak_reason(other_machine, time.time()) is None
    assert leak_reason({EXPIRES: "1"}, time.time()) == "its expiry time has passed"
    assert leak_reason({}, time.time()) is None  # e.g. a compose service: never ours to remove
    assert mine[OWNER_PID] == str(os.getpid())


def frames(*parts: tuple[int, bytes]) -> bytes:
    return b"".join(struct.pack(">BxxxL", kind, len(data)) + data for kind, data in parts)


def test_the_stream_splitter_survives_every_split_point() -> None:
    stream = frames((1, b"hello "), (2, b"oops\n"), (1, b"world\n"), (1, b""), (2, "é\n".encode()))
    for cut_a, cut_b in itertools.combinations(range(len(stream) + 1), 2):
        splitter = DockerStreamSplitter()
        out: dict[int, bytes] = {1: b"", 2: b""}
        for piece in (stream[:cut_a], stream[cut_a:cut_b], stream[cut_b:]):
            for number, data in splitter.feed(piece):
                out[number] += data
        assert (out[1], out[2].decode()) == (b"hello world\n", "oops\né\n")


def every_docker_exception() -> list[BaseException]:
    response = requests.Response()
    response.status_code = 500
    return [
        docker.errors.ImageNotFound("no image"),
        docker.errors.NotFound("no container"),
        docker.errors.APIError("boom", response=response),
        docker.errors.DockerException("Error while fetching server API version: Connection refused"),
        docker.errors.DockerException("something else"),
        docker.errors.InvalidArgument("bad"),
        requests.exceptions.ConnectionError("refused"),
        requests.exceptions.ReadTimeout("slow"),
        requests.exceptions.ChunkedEncodingError("cut"),
        ConnectionRefusedError("refused"),
        FileNotFoundError("no socket"),
    ]


@pytest.mark.parametrize("error", every_docker_exception(), ids=lambda e: type(e).__name__)
def test_every_daemon_error_maps_into_the_tree(error: BaseException) -> None:
    with pytest.raises(ExecutorError) as mapped, _daemon.daemon_errors():
        raise error
    assert mapped.value.__cause__ is error


def test_unreachable_daemon_errors_say_how_to_start_it() -> None:
    for error in (requests.exceptions.ConnectionError("refused"), FileNotFoundError("no socket")):
        mapped = _daemon.map_docker_error(error)
        assert isinstance(mapped, BackendUnavailableError) and "dockerd" in str(mapped)
    assert isinstance(_daemon.map_docker_error(docker.errors.NotFound("x")), SandboxFailedError)
    assert "images build" in str(_daemon.map_docker_error(docker.errors.ImageNotFound("x")))


def test_every_docker_exception_class_is_covered_by_a_mapping_test() -> None:
    """Fails when docker-py grows an exception class this module has not been checked against."""
    tested = {type(e) for e in every_docker_exception()}
    known_irrelevant = {  # raised only by APIs the backend does not use (contexts, TLS, builds, loads)
        "ContextAlreadyExists", "ContextException", "ContextNotFound", "MissingContextParameter",
        "TLSParameterError", "BuildError", "ImageLoadError", "ContainerError", "InvalidVersion",
        "InvalidRepository", "InvalidConfigFile", "DeprecatedMethod", "NullResource", "StreamParseError",
    }  # fmt: skip
    for name in dir(docker.errors):
        candidate = getattr(docker.errors, name)
        if (
            isinstance(candidate, type)
            and issubclass(candidate, Exception)
            and candidate.__module__ == "docker.errors"
        ):
            assert candidate in tested or name in known_irrelevant, f"docker.errors.{name} is not covered"


def test_idempotent_calls_retry_transient_errors_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_daemon, "RETRY_BUDGET_SECONDS", 5.0)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise requests.exceptions.ConnectionError("daemon restarting")
        return "ok"

    assert _daemon.idempotent(flaky) == "ok" and len(calls) == 3

    response = requests.Response()
    response.status_code = 404
    missing: list[int] = []

    def not_found() -> None:
        missing.append(1)
        raise docker.errors.NotFound("gone", response=response)

    with pytest.raises(SandboxFailedError):
        _daemon.idempotent(not_found)
    assert len(missing) == 1  # a client error is an answer, not a hiccup: never retried
