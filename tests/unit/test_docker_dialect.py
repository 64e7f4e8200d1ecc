"""The Podman dialect's reading of inspect, against recorded podman 4.3.1 answers (tests/integration/
test_podman.py runs the real engine): what is counted, what is left for the Docker checks to refuse."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.backends.docker._dialect import Dialect, _profile_path, dialect_of, podman_view
from adk_sandbox.executor.backends.docker._spec import (
    ContainerSpec,
    hardening_violations,
    host_config_arguments,
)
from adk_sandbox.executor.types import ResourceLimits

_DEFAULT_CAPS = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
]
_SPEC = ContainerSpec(image="adk-sandbox/base", limits=ResourceLimits())


def _compat_inspect() -> dict[str, Any]:
    """A podman compat inspect as recorded (the fields the checks read)."""
    limits = _SPEC.limits
    tmpfs = {
        path: options + ",rprivate,tmpcopyup"
        for path, options in host_config_arguments(_SPEC)["tmpfs"].items()
    }
    tmpfs |= {"/run": "rw,rprivate,nosuid,nodev,tmpcopyup", "/var/tmp": "rw,rprivate,nosuid,nodev,tmpcopyup"}
    return {
        "Id": "c0ffee",
        "State": {"Running": True, "OOMKilled": False},
        "Mounts": [],
        "HostConfig": {
            "CapDrop": list(_DEFAULT_CAPS),
            "CapAdd": [],
            "SecurityOpt": ["no-new-privileges", f"seccomp={_profile_path()}"],
            "Runtime": "oci",
            "NetworkMode": "none",
            "Tmpfs": tmpfs,
            "ReadonlyRootfs": True,
            "MaskedPaths": None,
            "ReadonlyPaths": None,
            "CgroupnsMode": "",
            "Memory": limits.memory_mb << 20,
            "MemorySwap": limits.memory_mb << 20,
            "PidsLimit": limits.pids,
            "NanoCpus": int(limits.cpus * 1e9),
        },
    }


class _Api:
    base_url = "http+docker://localhost"

    def __init__(self, libpod: dict[str, Any], version: dict[str, Any]) -> None:
        self.libpod = libpod
        self._version = version

    def get(self, url: str) -> dict[str, Any]:
        assert url.endswith("/v4.0.0/libpod/containers/c0ffee/json")
        return self.libpod

    def _result(self, response: dict[str, Any], json: bool) -> dict[str, Any]:
        return response


class _Client:
    def __init__(self, libpod: dict[str, Any], components: list[str]) -> None:
        self.api = _Api(libpod, {})
        self._components = components

    def version(self) -> dict[str, Any]:
        return {"Components": [{"Name": name} for name in self._components]}


def _libpod(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    oci = tmp_path / "config.json"
    oci.write_text(json.dumps({"linux": {"maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"]}}))
    record = {"OCIRuntime": "runc", "BoundingCaps": None, "EffectiveCaps": None, "OCIConfigPath": str(oci),
              "HostConfig": {"CgroupMode": "host"}}  # fmt: skip
    return record | changes


def _violations(client: _Client, runtime: str | None = None) -> tuple[list[str], tuple[str, ...]]:
    view = podman_view(client, _compat_inspect())  # type: ignore[arg-type]
    tmpfs = host_config_arguments(_SPEC)["tmpfs"]
    problems = hardening_violations(view.inspect, runtime=runtime, limits=_SPEC.limits, tmpfs=tmpfs)
    return problems, view.deviations


def test_the_dialect_comes_from_the_version_components() -> None:
    assert dialect_of(_Client({}, ["Podman Engine", "Conmon"])) is Dialect.PODMAN  # type: ignore[arg-type]
    assert dialect_of(_Client({}, ["Engine", "containerd", "runc"])) is Dialect.DOCKER  # type: ignore[arg-type]


def test_a_recorded_podman_container_passes_with_its_deviations_reported(tmp_path: Path) -> None:
    problems, deviations = _violations(_Client(_libpod(tmp_path), ["Podman Engine"]))
    assert problems == []
    assert any("CapDrop is reported as the default list (14" in d for d in deviations)
    assert any("/run, /var/tmp" in d for d in deviations)
    assert any("cgroup namespace" in d for d in deviations)
    # Without the dialect the same inspect fails the Docker checks.
    raw = hardening_violations(
        _compat_inspect(), limits=_SPEC.limits, tmpfs=host_config_arguments(_SPEC)["tmpfs"]
    )
    assert any("capabilities are not all dropped" in p for p in raw)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"BoundingCaps": ["CAP_SYS_ADMIN"]}, "capabilities are not all dropped"),
        ({"EffectiveCaps": ["CAP_NET_RAW"]}, "capabilities are not all dropped"),
        ({"OCIConfigPath": "/nonexistent/config.json"}, "/proc and /sys paths are not masked"),
    ],
)
def test_what_libpod_cannot_confirm_is_left_for_the_checks_to_refuse(
    tmp_path: Path, changes: dict[str, Any], problem: str
) -> None:
    problems, _ = _violations(_Client(_libpod(tmp_path, **changes), ["Podman Engine"]))
    assert any(problem in p for p in problems), problems


def test_runsc_asked_but_runc_running_is_refused(tmp_path: Path) -> None:
    problems, _ = _violations(_Client(_libpod(tmp_path), ["Podman Engine"]), runtime="runsc")
    assert "runtime is 'runc', not 'runsc'" in problems


def test_a_seccomp_path_holding_another_profile_is_not_the_sandboxs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW"}))
    inspect = _compat_inspect()
    inspect["HostConfig"]["SecurityOpt"] = ["no-new-privileges", f"seccomp={other}"]
    view = podman_view(_Client(_libpod(tmp_path), ["Podman Engine"]), copy.deepcopy(inspect))  # type: ignore[arg-type]
    problems = hardening_violations(view.inspect)
    assert any("not the sandbox's" in p for p in problems)
