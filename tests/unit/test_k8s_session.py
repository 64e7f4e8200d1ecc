"""A session's start against a fake API replaying recorded objects: failures surface, no Pod is left."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig, api_error
from adk_sandbox.executor.backends.kubernetes._exec import WebSocketLike
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    PolicyNotEnforceableError,
)
from tests.k8s_api_stubs import ClusterWithoutClaims

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"


def load(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class FakeApi(ClusterWithoutClaims):
    """Answers ``read_pod`` with recorded Pods (the last one repeats); records creates and deletes."""

    def __init__(self, pods: Sequence[dict[str, Any]] = (), create_error: str | None = None) -> None:
        super().__init__()
        self.pods = list(pods)
        self.create_error = create_error
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        if self.create_error:
            recorded = load("api_errors")[self.create_error]
            raise api_error(recorded["status"], recorded["body"], "create the session Pod")
        self.created.append(pod)
        return pod

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.pop(0) if len(self.pods) > 1 else self.pods[0]
        return {**pod, "metadata": {**pod["metadata"], "name": name}}

    def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(name)

    def open_exec(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> WebSocketLike:
        raise AssertionError("the start must fail before any exec")


CONFIG = KubernetesConfig(namespace="evals", image="registry.example.com/adk-sandbox/base:1.4")


def test_image_pull_back_off_fails_the_start_and_deletes_the_pod() -> None:
    failures = load("pod_failures")
    api = FakeApi([failures["container_creating"], failures["image_pull_backoff"]])
    session = KubernetesBackend(CONFIG, api=api).session()
    with pytest.raises(BackendUnavailableError, match="cannot pull the session image"):
        session.start()
    assert [pod["metadata"]["name"] for pod in api.created] == api.deleted == [session.pod_name]
    assert api.policies and api.policies[0]["kind"] == "NetworkPolicy"  # network off: the policy first


def test_quota_exceeded_at_create_is_a_clear_error_and_nothing_is_left() -> None:
    api = FakeApi(create_error="quota_exceeded")
    with pytest.raises(BackendUnavailableError, match="ResourceQuota"):
        KubernetesBackend(CONFIG, api=api).session().start()
    assert api.created == []


def test_a_pod_loosened_by_admission_is_refused_and_deleted() -> None:
    api = FakeApi([load("pod_mutated_by_webhook")])
    session = KubernetesBackend(CONFIG, api=api).session()
    with pytest.raises(PolicyNotEnforceableError, match="not hardened"):
        session.start()
    assert api.deleted == [session.pod_name]


def test_a_host_workspace_puts_the_pods_workspace_at_its_own_path(tmp_path: Path) -> None:
    # What the mirror relies on: the emptyDir it fills, and the commands' cwd, are the host path.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    failures = load("pod_failures")
    api = FakeApi([failures["image_pull_backoff"]])
    session = KubernetesBackend(CONFIG, api=api).session(workspace=tmp_path / "link")
    root = str((tmp_path / "real").resolve())
    assert session.workspace == root and session.workspace_transport == "mirror"
    with pytest.raises(BackendUnavailableError):
        session.start()
    (created,) = api.created
    container = created["spec"]["containers"][0]
    assert container["workingDir"] == root
    assert {"name": "workspace", "mountPath": root} in container["volumeMounts"]
    assert created["spec"]["volumes"][0] == {
        "name": "workspace",
        "emptyDir": {"medium": "Memory", "sizeLimit": f"{CONFIG.workspace_mb}Mi"},  # the mirror's cap
    }
    assert api.deleted == [session.pod_name]


@pytest.mark.parametrize(
    ("where", "message"),
    [("/tmp", "mounts itself"), ("/proc/self", "lies in /proc"), ("/dev/shm", "lies in /dev")],
)
def test_a_workspace_a_pod_cannot_mount_there_is_refused(where: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        KubernetesBackend(CONFIG, api=FakeApi()).session(workspace=where)


def test_a_workspace_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidRequestError, match="not a directory"):
        KubernetesBackend(CONFIG, api=FakeApi()).session(workspace=tmp_path / "file")


def test_a_workspace_whose_path_is_not_utf8_is_refused(tmp_path: Path) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(odd)
    with pytest.raises(InvalidRequestError, match="not valid UTF-8"):
        KubernetesBackend(CONFIG, api=FakeApi()).session(workspace=os.fsdecode(odd))


class ClaimingApi(FakeApi):
    """A cluster serving agent-sandbox's claims (nothing is claimed: the refusal comes first)."""

    def has_claims(self) -> bool:
        return True


def test_a_host_workspace_is_refused_with_a_warm_pool(tmp_path: Path) -> None:
    api = ClaimingApi()
    backend = KubernetesBackend(CONFIG.model_copy(update={"warm_pool": "pool"}), api=api)
    with pytest.raises(InvalidRequestError, match="warm pool 'pool' cannot have a host workspace"):
        backend.session(workspace=tmp_path)
    assert backend.sessions() == () and api.created == []


def test_a_warm_pool_without_the_crds_is_refused() -> None:
    with pytest.raises(BackendUnavailableError, match="agent-sandbox"):
        KubernetesBackend(CONFIG.model_copy(update={"warm_pool": "pool"}), api=FakeApi())


def test_the_backend_holds_only_its_open_sessions_and_closes_them() -> None:
    backend = KubernetesBackend(CONFIG, api=FakeApi())
    sessions = [backend.session() for _ in range(3)]  # never started: no Pod
    sessions[0].close()
    assert set(backend.sessions()) == set(sessions[1:])
    assert backend.session_by_id(sessions[1].session_id) is sessions[1]
    assert backend.session_by_id(sessions[0].session_id) is None
    backend.close()
    assert all(session.closed for session in sessions) and backend.sessions() == ()
