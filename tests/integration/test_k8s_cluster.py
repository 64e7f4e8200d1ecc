"""The Kubernetes backend against a real cluster: the one-node cluster of ``../shared/k8s`` in CI.

``scripts/test`` starts it (``scripts/k8s-cluster``) and exports ``ADK_SANDBOX_K8S_CONTEXT``; with ``CI``
set and the cluster's directory there, a missing context fails these tests rather than skipping them
(tests/integration/k8s_cluster.py). Any other cluster works too (docs/KUBERNETES.md)::

    ADK_SANDBOX_K8S_CONTEXT=my-context ADK_SANDBOX_K8S_IMAGE=registry.example/adk-sandbox/base:1 \
        ADK_SANDBOX_K8S_PULL_POLICY=IfNotPresent [ADK_SANDBOX_K8S_NAMESPACE=adk-sandbox-test] \
        [ADK_SANDBOX_K8S_RUNTIME_CLASS=gvisor] \
        pytest tests/integration/test_k8s_cluster.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, IsolationClass, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
from adk_sandbox.executor.errors import BackendUnavailableError, PolicyNotEnforceableError
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster

pytestmark = require_cluster()


def _config(**changes: object) -> KubernetesConfig:
    return cluster_config(**changes)


@pytest.fixture
def backend() -> Iterator[KubernetesBackend]:
    with KubernetesBackend(_config(), context=CONTEXT) as made:
        yield made


def test_a_session_runs_commands_in_one_pod_and_deletes_it(backend: KubernetesBackend) -> None:
    with backend.session() as session:
        first = session.execute(
            ExecRequest(language=Language.COMMAND, code="echo $$ > x; id -u; pwd", timeout=30)
        )
        assert first.exit_code == 0
        assert first.stdout.split() == [str(backend.config.uid), backend.config.workspace_path]
        again = session.execute(ExecRequest(language=Language.COMMAND, code="cat x", timeout=30))
        assert again.exit_code == 0 and again.stdout.strip()
        name = session.pod_name
    assert name is not None
    deadline = time.monotonic() + 60
    api = backend._api
    while api.read_pod(backend.config.namespace, name) is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert api.read_pod(backend.config.namespace, name) is None


def test_hardening_from_inside(backend: KubernetesBackend) -> None:
    with backend.session() as session:
        ro = session.execute(ExecRequest(language=Language.COMMAND, code="touch /etc/x", timeout=30))
        assert ro.exit_code != 0
        token = session.execute(
            ExecRequest(language=Language.COMMAND, code="ls /var/run/secrets/kubernetes.io", timeout=30)
        )
        assert token.exit_code != 0  # no service-account token
        caps = session.capabilities()
        assert caps.memory and caps.cpu and caps.fs_write and caps.env
        if backend.config.runtime_class_name:
            assert caps.isolation is IsolationClass.GVISOR


def test_timeout_and_cancel_kill_the_tree(backend: KubernetesBackend) -> None:
    with backend.session() as session:
        result = session.execute(
            ExecRequest(language=Language.COMMAND, code="sleep 60 & sleep 60", timeout=2)
        )
        assert result.timed_out and result.exit_code is None
        cancel = threading.Event()
        threading.Timer(1.0, cancel.set).start()
        cancelled = session.execute(
            ExecRequest(language=Language.COMMAND, code="sleep 60", timeout=30), cancel=cancel
        )
        assert cancelled.cancelled
        left = session.execute(
            ExecRequest(language=Language.COMMAND, code="pgrep -c sleep || true", timeout=30)
        )
        assert left.stdout.strip() in ("0", "1")  # the keeper (PID 1) is a sleep too


def test_stdin_reaches_the_command(backend: KubernetesBackend) -> None:
    with backend.session() as session:
        result = session.execute(
            ExecRequest(language=Language.COMMAND, code="wc -c", stdin=b"x" * 100_000, timeout=30)
        )
        assert result.stdout.strip() == "100000"


def test_network_is_reported_from_the_policy_and_the_probe(backend: KubernetesBackend) -> None:
    with backend.session() as session:
        caps = session.capabilities()
        probe = session.execute(
            ExecRequest(
                argv=("python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 3)"),
                timeout=30,
            )
        )
        # Reported denied only when it really is: a CNI without NetworkPolicy support must show False.
        assert caps.network is (probe.exit_code != 0)


def test_a_host_workspace_travels_as_a_copy_at_its_own_path(
    backend: KubernetesBackend, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("from the host\n")
    with backend.session(workspace=tmp_path) as session:
        result = session.execute(
            ExecRequest(
                language=Language.COMMAND,
                code="pwd; cat in.txt; echo back > out.txt; ln -s /etc/passwd leak",
                timeout=60,
            )
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == [str(tmp_path.resolve()), "from the host"]
        assert "leak" in result.stderr  # a link out is refused, and said
        assert session.capabilities().workspace == "mirror"
        (tmp_path / "late.txt").write_text("pushed before the next command\n")
        late = session.execute(ExecRequest(language=Language.COMMAND, code="cat late.txt", timeout=30))
        assert late.stdout == "pushed before the next command\n"
    assert (tmp_path / "out.txt").read_text() == "back\n"
    assert not (tmp_path / "leak").is_symlink()


def test_an_unpullable_image_is_a_clear_error() -> None:
    config = _config(image="registry.invalid/adk-sandbox/none:0", image_pull_policy="IfNotPresent")
    with (
        KubernetesBackend(config, context=CONTEXT) as backend,
        pytest.raises(BackendUnavailableError, match="pull"),
    ):
        backend.session().start()


def test_another_user_is_refused(backend: KubernetesBackend) -> None:
    with backend.session() as session, pytest.raises(PolicyNotEnforceableError, match="pods/exec"):
        session.execute(ExecRequest(language=Language.COMMAND, code="id", user="0:0", timeout=30))


# The warm_pool (agent-sandbox) path: tests/integration/test_k8s_cluster_claims.py.
