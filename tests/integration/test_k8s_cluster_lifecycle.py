"""On the real cluster: nothing is left after close, after a pool's close, or after the owner's SIGKILL.

The owner is a child process that opens sessions and a pool and is SIGKILLed with them running; the next
``KubernetesBackend`` of the namespace deletes its Pods at start (its reaper: the owner's pid, start time,
boot and pid namespace are the Pods' labels), and the API server is asked afterwards. A naive design
without owner labels (or a reaper that goes by expiry only) leaves the Pods running until their
``activeDeadlineSeconds``: 12 hours by default.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesPoolConfig
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster

pytestmark = require_cluster()

PROJECT = "io.adk-sandbox.project=adk-sandbox"


def _pods(backend: KubernetesBackend, selector: str = PROJECT) -> list[str]:
    return [p["metadata"]["name"] for p in backend._api.list_pods(backend.config.namespace, selector)]


def test_a_pool_serves_started_pods_and_its_close_leaves_nothing() -> None:
    with KubernetesBackend(cluster_config(), context=CONTEXT, pool=KubernetesPoolConfig(size=2)) as backend:
        pool = backend.pool
        assert pool is not None and pool.wait_ready(120)
        ready = set(_pods(backend))
        with backend.session() as session:
            assert session.pod_name in ready  # started before it was asked for
            result = session.execute(ExecRequest(language=Language.COMMAND, code="id -u", timeout=30))
            assert result.stdout == f"{backend.config.uid}\n"
            assert session.capabilities().network is True  # the pool's Pods have their interfaces down too
        assert pool.stats().served == 1
        owned = set(_pods(backend)) | ready
    with KubernetesBackend(cluster_config(), context=CONTEXT) as after:
        deadline = time.monotonic() + 30
        while owned & set(_pods(after)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not owned & set(_pods(after))


OWNER = textwrap.dedent(
    """
    import sys
    from adk_sandbox.executor import ExecRequest, Language
    from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
    config = KubernetesConfig.model_validate_json(sys.argv[1])
    backend = KubernetesBackend(config, context=sys.argv[2], pool=1)
    sessions = [backend.session() for _ in range(2)]
    for session in sessions:
        session.execute(ExecRequest(language=Language.COMMAND, code="true", timeout=30))
    backend.pool.wait_ready(120)
    print(" ".join(s.session_id for s in sessions), flush=True)
    sys.stdin.read()  # until killed
    """
)


def test_the_pods_of_a_sigkilled_owner_are_deleted_by_the_next_backend() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", OWNER, cluster_config().model_dump_json(), CONTEXT or ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as owner:
        assert owner.stdout is not None
        session_ids = owner.stdout.readline().split()
        assert len(session_ids) == 2, "the owner did not start its sessions"
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    with KubernetesBackend(cluster_config(), context=CONTEXT) as next_backend:
        reaped = {pod.name for pod in next_backend.reaped}
        for session_id in session_ids:
            assert f"adk-sandbox-{session_id}" in reaped
        assert len(reaped) >= 3, reaped  # the two sessions and the pool's started Pod
        assert not reaped & set(_pods(next_backend))
