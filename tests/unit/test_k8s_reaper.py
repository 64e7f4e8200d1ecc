"""The Pod reaper: which session Pods are leaked (owner gone, expiry passed), judged from the labels the
backend really writes (:func:`pod_spec` of :func:`owner_labels`), and what it deletes through the API."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor._owner import (
    EXPIRES,
    OWNER_HOST,
    OWNER_PID,
    OWNER_PIDNS,
    OWNER_START,
    owner_labels,
)
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig, api_error, pod_spec
from adk_sandbox.executor.backends.kubernetes._reaper import (
    PROJECT_SELECTOR,
    find_leaked_pods,
    reap_leaked_pods,
)
from adk_sandbox.executor.backends.kubernetes._spec import owner_labels_of_pod, pod_owner_labels
from adk_sandbox.executor.cli import main
from tests.unit.test_k8s_session import FakeApi

CONFIG = KubernetesConfig(image="registry.example/adk-sandbox/base:1")


def pod(name: str, **changes: str | None) -> dict[str, Any]:
    """A session Pod of this process as the backend makes it, with some owner labels changed (None drops)."""
    made = pod_spec(CONFIG, owner_labels(name, 3600), name=name)
    labels = made["metadata"]["labels"]
    for key, value in changes.items():
        label = {"pid": OWNER_PID, "start": OWNER_START, "expires": EXPIRES, "host": OWNER_HOST,
                 "pidns": OWNER_PIDNS}[key]  # fmt: skip
        if value is None:
            labels.pop(label, None)
        else:
            labels[label] = value
    return made


def dead_pid() -> str:
    """The pid of a process that has ended (the start time no longer matches anything)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return str(child.pid)


def test_the_pod_labels_carry_where_the_owner_runs_as_valid_label_values() -> None:
    labels = pod("a")["metadata"]["labels"]
    assert labels[OWNER_PIDNS].isdigit()  # "pid:[N]" is no valid label value: N alone
    assert owner_labels_of_pod(labels) is not None
    assert owner_labels_of_pod(labels)[OWNER_PIDNS] == owner_labels("a", 1)[OWNER_PIDNS]  # type: ignore[index]
    # A host name that is no valid label value: both left out, so the Pod is judged by its expiry alone.
    odd = pod_owner_labels({**owner_labels("b", 1), OWNER_HOST: "under_score-" + "x" * 70})
    assert OWNER_HOST not in odd and OWNER_PIDNS not in odd


def test_a_live_owners_pod_is_kept_and_a_dead_or_expired_owners_pod_is_leaked() -> None:
    pods = [
        pod("mine"),
        pod("orphan", pid=dead_pid()),
        pod("expired", expires=str(int(time.time()) - 5)),
    ]
    leaked = {p.name: p.reason for p in find_leaked_pods(pods)}
    assert set(leaked) == {"orphan", "expired"}
    assert "gone" in leaked["orphan"] and "expiry" in leaked["expired"]


def test_pods_of_other_hosts_or_without_an_owner_host_go_by_expiry_only() -> None:
    """A dead pid of another host (or of a Pod not saying where) means nothing here: such a Pod is kept."""
    other_host = pod("elsewhere", pid=dead_pid(), host="another-machine")
    other_namespace = pod("other-ns", pid=dead_pid(), pidns="1")
    unknown = pod("unknown", pid=dead_pid(), host=None)
    assert find_leaked_pods([other_host, other_namespace, unknown]) == []
    assert len(find_leaked_pods([pod("gone", pid=dead_pid(), host=None, expires="1")])) == 1


def test_pods_this_project_did_not_make_or_that_another_object_owns_are_never_touched() -> None:
    foreign = pod("foreign", expires="1")
    foreign["metadata"]["labels"] = {"app": "web", EXPIRES: "1"}
    claimed = pod("claimed", expires="1")
    claimed["metadata"]["ownerReferences"] = [{"kind": "Sandbox", "name": "pool-x"}]
    assert find_leaked_pods([foreign, claimed]) == []


class ListingApi:
    """Lists the given Pods for the project's selector; records deletions."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.selectors: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.selectors.append((namespace, label_selector))
        return self.pods

    def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append((namespace, name))


def test_reaping_deletes_exactly_the_leaked_pods_of_the_namespace() -> None:
    mine, orphan = pod("mine"), pod("orphan", pid=dead_pid())
    api = ListingApi([mine, orphan])
    removed = reap_leaked_pods(api, "evals")  # type: ignore[arg-type]
    assert api.selectors == [("evals", PROJECT_SELECTOR)]
    assert api.deleted == [("evals", orphan["metadata"]["name"])] == [("evals", removed[0].name)]


def test_the_cli_says_clearly_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No kubeconfig here (none can exist on this machine): a clear error, not a traceback."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(tmp_path / "none"))
        assert main(["cleanup", "--kubernetes", "--context", "nope"]) == 1
    assert "no usable kubeconfig context nope" in capsys.readouterr().err
    assert main(["cleanup", "--kubernetes", "--session", "abc"]) == 2
    assert "not with --kubernetes" in capsys.readouterr().err


class StartingApi(FakeApi):
    """The session tests' fake API, listing ``listed`` (or refusing to list, like RBAC would)."""

    def __init__(self, listed: list[dict[str, Any]] | None) -> None:
        super().__init__()
        self.listed = listed

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        if self.listed is None:
            body = '{"reason": "Forbidden", "message": "pods is forbidden"}'
            raise api_error(403, body, "list the session Pods")
        return self.listed


def test_a_backend_start_deletes_a_sigkilled_owners_pods_and_goes_on_when_it_may_not_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orphan = pod("orphan", pid=dead_pid())
    api = StartingApi([pod("mine"), orphan])
    backend = KubernetesBackend(CONFIG, api=api)  # type: ignore[arg-type]
    assert [p.name for p in backend.reaped] == ["orphan"] and api.deleted == ["orphan"]
    forbidden = StartingApi(None)
    with caplog.at_level("WARNING"):
        assert KubernetesBackend(CONFIG, api=forbidden).reaped == []  # type: ignore[arg-type]
    assert "were not looked for" in caplog.text and forbidden.deleted == []
