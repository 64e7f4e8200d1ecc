"""Attacks from inside a session Pod of the real cluster, each checked from the host or the API server.

A hostile command wants the cluster: a service-account token, the API server, the node's kubelet, the
node's files, or a Pod without the runtime it was promised. Network off is the default, so most attempts
meet a Pod whose interfaces are down; the ones that matter with the cluster network are tried with
``network=True`` too. The control in each says what a naive design would have given.
"""

from __future__ import annotations

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesSession
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster
from tests.integration.test_k8s_egress_on_docker import BYPASS

pytestmark = require_cluster()

NODE = "10.244.0.1"  # the node as its Pods see it (../shared/k8s: the CNI bridge's gateway)
API_SERVICE = "10.96.0.1"  # the `kubernetes` Service's address (the cluster's service range, first IP)

# Asks the kubelet for its Pods, with whatever credentials a Pod could find (none, if the Pod is right).
KUBELET = f"""
import ssl, urllib.request, urllib.error
context = ssl.create_default_context(); context.check_hostname = False; context.verify_mode = ssl.CERT_NONE
try:
    urllib.request.urlopen("https://{NODE}:10250/pods", context=context, timeout=30)
    print("KUBELET ANSWERED")
except urllib.error.HTTPError as error:
    print("kubelet said", error.code)
except OSError as error:
    print("no connection", repr(error))
"""


def run(session: KubernetesSession, code: str, language: Language = Language.COMMAND) -> ExecResult:
    return session.execute(ExecRequest(language=language, code=code, timeout=60))


@pytest.fixture(scope="module", params=[False, True], ids=["network-off", "network-on"])
def session(request: pytest.FixtureRequest) -> KubernetesSession:
    backend = KubernetesBackend(cluster_config(network=request.param), context=CONTEXT)
    request.addfinalizer(backend.close)
    opened = backend.session()
    opened.start()
    return opened


def test_no_credentials_inside(session: KubernetesSession) -> None:
    found = run(session, "ls /var/run/secrets /run/secrets 2>&1; env | grep -ci kube || true")
    assert "No such file" in found.stdout and found.stdout.splitlines()[-1] == "0", found.stdout
    pod = session._pod or {}
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any("projected" in v or "secret" in v for v in pod["spec"].get("volumes", []))


def test_the_api_server_and_the_kubelet_are_out_of_reach(session: KubernetesSession) -> None:
    targets = [(API_SERVICE, 443), (NODE, 16443), (NODE, 10250)]
    tried = run(session, f"TARGETS = {targets!r}\n{BYPASS}", Language.PYTHON)
    kubelet = run(session, KUBELET, Language.PYTHON)
    if session.capabilities().network:  # network off: nothing connects at all
        assert "CONNECTED" not in tried.stdout, tried.stdout
        assert kubelet.stdout.startswith("no connection"), kubelet.stdout
    else:  # the cluster network: the kubelet's port answers, and refuses a Pod without credentials
        for _ in range(3):  # a Pod just started may wait on its first ARP exchange with the node: again
            if kubelet.stdout.strip() == "kubelet said 401":
                break
            kubelet = run(session, KUBELET, Language.PYTHON)
        assert kubelet.stdout.strip() == "kubelet said 401", kubelet.stdout
        assert f"CONNECTED ({API_SERVICE!r}, 443)" not in tried.stdout  # no Service routing from Pods here


def test_no_host_path_and_its_own_process_namespace(session: KubernetesSession) -> None:
    pod = session._pod or {}
    assert not any("hostPath" in volume for volume in pod["spec"].get("volumes", []))
    seen = run(
        session, "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'; ls /var/tmp/adk-k8s"
    )
    first, count, *_ = seen.stdout.splitlines()
    assert first.startswith("sleep "), first  # PID 1 is the Pod's keeper, not the node's init
    assert int(count) < 20, seen.stdout  # the Pod's own processes only
    assert "No such file" in seen.stderr  # the node's cluster state is not in the Pod


def test_a_runtime_class_that_does_not_exist_is_refused_not_dropped() -> None:
    config = cluster_config(runtime_class_name="does-not-exist")
    with KubernetesBackend(config, context=CONTEXT) as backend:
        with pytest.raises(PolicyNotEnforceableError, match="RuntimeClass"):
            backend.session().start()
        left = backend._api.list_pods(backend.config.namespace, "io.adk-sandbox.project=adk-sandbox")
        assert not any(p["spec"].get("runtimeClassName") == "does-not-exist" for p in left)
