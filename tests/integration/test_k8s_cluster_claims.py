"""The agent-sandbox path (``warm_pool=``) of the Kubernetes backend against the real API server, bound by a
test reconciler.

agent-sandbox's CRDs (``tests/fixtures/agent-sandbox-crds``, vendored from kubernetes-sigs/agent-sandbox) are
applied to the cluster, so every object here is validated and stored by the real API server: the backend's
SandboxClaim, the Sandbox and Pod made from the pool's SandboxTemplate (which is ``pod_spec(config)``), the
status written through the ``status`` subresource, and the deletion of the claim cascading to the Sandbox and
its Pod by the cluster's garbage collector. agent-sandbox's controller cannot be built on these machines
(it needs a newer Go and has no ``vendor/``), so :class:`_TestReconciler`, a thread of this test, does its
cold-path work in its place, with the shapes its source writes; what the real controller does beyond that
(warm adoption, the label-domain allowlist on the happy path) is not exercised here.

The cluster is the one ``tests/integration/k8s_cluster.py`` describes (``ADK_SANDBOX_K8S_CONTEXT``); its
``require_cluster`` is the fail-or-skip rule: in CI, where the cluster's state directory exists, a missing
cluster fails these tests instead of skipping them.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig, pod_spec
from adk_sandbox.executor.errors import BackendUnavailableError
from tests.integration.k8s_cluster import CONTEXT, cluster_config, require_cluster

pytestmark = require_cluster()

CRDS = Path(__file__).parent.parent / "fixtures" / "agent-sandbox-crds"
CRD_NAMES = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)
#: A namespace of its own: other suites' backends reap (and count) the Pods of theirs.
NAMESPACE = os.environ.get("ADK_SANDBOX_K8S_CLAIMS_NAMESPACE", "adk-sandbox-claims")
POOL = "adk-python"
#: A pool whose claims the test reconciler checks as agent-sandbox's controller does by default.
STRICT_POOL = "adk-strict"
#: A pool the test reconciler leaves alone: as if no controller ran.
IGNORED_POOL = "adk-unwatched"

EXT = ("extensions.agents.x-k8s.io", "v1beta1")
CORE = ("agents.x-k8s.io", "v1beta1")
CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"
NAME_HASH_LABEL = "agents.x-k8s.io/sandbox-name-hash"


def _config(**changes: Any) -> KubernetesConfig:
    return cluster_config(
        **{"namespace": NAMESPACE, "warm_pool": POOL, "startup_timeout_seconds": 60.0, **changes}
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(status: str, reason: str, message: str, generation: int) -> dict[str, Any]:
    """A ``metav1.Condition`` of type Ready (the CRDs require all five of its fields)."""
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": _now(),
    }


def _name_hash(name: str) -> str:
    """agent-sandbox's ``NameHash``: FNV-1a 32 of the Sandbox's name, 8 hex digits."""
    value = 0x811C9DC5
    for byte in name.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class _TestReconciler(threading.Thread):
    """A test reconciler: stands in for agent-sandbox's controller, which cannot be built here.

    It does the cold path of its SandboxClaim and Sandbox controllers (``extensions/controllers/
    sandboxclaim_controller.go``, ``controllers/sandbox_controller.go`` at the vendored commit) through the
    real API server: for each claim of the namespace it reads the claim's SandboxWarmPool and its
    SandboxTemplate, creates a Sandbox named after the claim (owned by it, the template's pod metadata merged
    with the claim's ``additionalPodMetadata``, no label overridden), then that Sandbox's Pod (named after it,
    owned by it, with the ``sandbox-name-hash`` label), and writes the status through the ``status``
    subresource as the controllers do: the Sandbox's ``Ready`` condition (``DependenciesNotReady`` "Pod exists
    with phase: ..." until the Pod is Ready with an IP, then ``DependenciesReady`` "Pod is Ready"), forwarded
    to the claim with ``status.sandbox.name`` and ``podIPs``. A missing pool is ``WarmPoolNotFound``. Claims
    of ``STRICT_POOL`` get the controller's default ``additionalPodMetadata`` check (a label key needs a
    domain prefix in the allowlist, by default ``sandbox.users.io``): ``InvalidMetadata``. Claims of
    ``IGNORED_POOL`` are left alone. What it could not do is kept in ``errors``.
    """

    def __init__(self, namespace: str) -> None:
        super().__init__(name="test-reconciler", daemon=True)
        import kubernetes  # noqa: PLC0415 - the optional k8s extra

        client = kubernetes.config.new_client_from_config(context=CONTEXT)  # type: ignore[no-untyped-call]
        self._client: Any = client
        self._custom: Any = kubernetes.client.CustomObjectsApi(client)
        self._core: Any = kubernetes.client.CoreV1Api(client)
        self._exception: Any = kubernetes.client.exceptions.ApiException
        self._namespace = namespace
        self._halt = threading.Event()
        self.errors: list[str] = []

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def run(self) -> None:
        while not self._halt.wait(0.2):
            try:
                claims = self._custom.list_namespaced_custom_object(*EXT, self._namespace, "sandboxclaims")
            except Exception as exc:
                self.errors.append(f"list claims: {exc}")
                continue
            for claim in claims.get("items") or []:
                try:
                    self._reconcile(claim)
                except Exception as exc:
                    if getattr(exc, "status", None) in (404, 409):  # gone or changed meanwhile: next pass
                        continue
                    self.errors.append(f"{claim['metadata']['name']}: {exc!r}")

    def _get(self, plural: str, name: str, group: tuple[str, str] = EXT) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._custom.get_namespaced_custom_object(
                *group, self._namespace, plural, name
            )
        except self._exception as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def _claim_status(
        self, claim: dict[str, Any], condition: dict[str, Any], sandbox: dict[str, Any]
    ) -> None:
        old = claim.get("status") or {}
        ready: dict[str, Any] = next((c for c in old.get("conditions") or [] if c.get("type") == "Ready"), {})
        if (ready.get("status"), ready.get("reason"), ready.get("message"), old.get("sandbox") or {}) == (
            condition["status"],
            condition["reason"],
            condition["message"],
            sandbox,
        ):
            return
        body = {
            "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},  # as its optimistic lock
            "status": {"conditions": [condition], "sandbox": sandbox},
        }
        name = claim["metadata"]["name"]
        self._custom.patch_namespaced_custom_object_status(*EXT, self._namespace, "sandboxclaims", name, body)

    def _reconcile(self, claim: dict[str, Any]) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        name, generation = meta["name"], meta.get("generation", 1)
        pool_name = spec["warmPoolRef"]["name"]
        if meta.get("deletionTimestamp") or pool_name == IGNORED_POOL:
            return
        pool = self._get("sandboxwarmpools", pool_name)
        if pool is None:
            message = f'SandboxWarmPool "{pool_name}" not found'
            self._claim_status(claim, _condition("False", "WarmPoolNotFound", message, generation), {})
            return
        template = self._get("sandboxtemplates", pool["spec"]["sandboxTemplateRef"]["name"])
        if template is None:
            self._claim_status(
                claim, _condition("False", "TemplateNotFound", "SandboxTemplate not found", generation), {}
            )
            return
        extra = dict((spec.get("additionalPodMetadata") or {}).get("labels") or {})
        if pool_name == STRICT_POOL:
            for key in sorted(extra):
                domain = key.split("/", 1)[0] if "/" in key else None
                if domain is None:
                    why = (
                        f"label \"{key}\" must have a domain prefix (e.g. 'sandbox.users.io/my-label') to "
                        "prevent opting into unintended policy domains"
                    )
                elif not (domain == "sandbox.users.io" or domain.endswith(".sandbox.users.io")):
                    why = f'label domain "{domain}" is not in the allowlist'
                else:
                    continue
                message = f'invalid additionalPodMetadata: failed to validate label "{key}": {why}'
                self._claim_status(claim, _condition("False", "InvalidMetadata", message, generation), {})
                return
        sandbox = self._get("sandboxes", name, CORE)
        if sandbox is None:
            pod_template = template["spec"]["podTemplate"]
            labels = dict((pod_template.get("metadata") or {}).get("labels") or {})
            for key, value in extra.items():
                if key in labels and labels[key] != value:
                    message = (
                        f'Error seen: metadata override conflict: label "{key}" is defined in template with '
                        f'value "{labels[key]}", but claim requests "{value}"'
                    )
                    self._claim_status(claim, _condition("False", "ReconcilerError", message, generation), {})
                    return
            labels.update(extra)
            labels[CLAIM_UID_LABEL] = meta["uid"]
            body = {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "metadata": {
                    "name": name,
                    "namespace": self._namespace,
                    "labels": {CLAIM_UID_LABEL: meta["uid"], "agents.x-k8s.io/launch-type": "cold"},
                    "annotations": {"agents.x-k8s.io/sandbox-template-ref": template["metadata"]["name"]},
                    "ownerReferences": [_owner(claim)],
                },
                "spec": {"podTemplate": {"metadata": {"labels": labels}, "spec": pod_template["spec"]}},
            }
            sandbox = self._custom.create_namespaced_custom_object(*CORE, self._namespace, "sandboxes", body)
            condition = _condition("False", "SandboxNotReady", "Sandbox is not ready", generation)
            self._claim_status(claim, condition, {"name": name})
            return
        self._reconcile_sandbox(claim, sandbox)

    def _reconcile_sandbox(self, claim: dict[str, Any], sandbox: dict[str, Any]) -> None:
        name, generation = sandbox["metadata"]["name"], sandbox["metadata"].get("generation", 1)
        pod_template = sandbox["spec"]["podTemplate"]
        try:
            pod = self._client.sanitize_for_serialization(
                self._core.read_namespaced_pod(name, self._namespace)
            )
        except self._exception as exc:
            if exc.status != 404:
                raise
            labels = dict(pod_template["metadata"]["labels"])
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self._namespace,
                    "labels": {**labels, NAME_HASH_LABEL: _name_hash(name)},
                    "annotations": {"agents.x-k8s.io/propagated-labels": ",".join(sorted(labels))},
                    "ownerReferences": [_owner(sandbox)],
                },
                "spec": pod_template["spec"],
            }
            self._core.create_namespaced_pod(self._namespace, body)
            return
        status = pod.get("status") or {}
        ips = [entry["ip"] for entry in status.get("podIPs") or []]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        if status.get("phase") == "Running" and ready and ips:
            condition = _condition("True", "DependenciesReady", "Pod is Ready", generation)
        else:
            condition = _condition(
                "False", "DependenciesNotReady", f"Pod exists with phase: {status.get('phase')}", generation
            )
        old: dict[str, Any] = next(
            (c for c in (sandbox.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {}
        )
        if (old.get("status"), old.get("message")) != (condition["status"], condition["message"]):
            sandbox_status = {
                "conditions": [condition],
                "podIPs": ips or None,
                "nodeName": (pod.get("spec") or {}).get("nodeName"),
                "selector": f"{NAME_HASH_LABEL}={_name_hash(name)}",
            }
            self._custom.patch_namespaced_custom_object_status(
                *CORE, self._namespace, "sandboxes", name, {"status": sandbox_status}
            )
        # The claim controller forwards the Sandbox's Ready condition, with the claim's generation.
        forwarded = {**condition, "observedGeneration": claim["metadata"].get("generation", 1)}
        self._claim_status(claim, forwarded, {"name": name, **({"podIPs": ips} if ips else {})})


def _kubectl(*args: str) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to apply agent-sandbox's CRDs"
    context = ["--context", CONTEXT] if CONTEXT else []
    subprocess.run([kubectl, *context, *args], check=True, capture_output=True, timeout=90)


@pytest.fixture(scope="module")
def reconciler() -> Iterator[_TestReconciler]:
    """agent-sandbox's CRDs applied (idempotent; they stay), the namespace, pool and template, and a running
    test reconciler."""
    import kubernetes  # noqa: PLC0415 - the optional k8s extra

    _kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    _kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{name}" for name in CRD_NAMES))
    client = kubernetes.config.new_client_from_config(context=CONTEXT)  # type: ignore[no-untyped-call]
    core: Any = kubernetes.client.CoreV1Api(client)
    custom: Any = kubernetes.client.CustomObjectsApi(client)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    template = pod_spec(_config())  # what a warm pool of this config must be made from
    for plural, name, spec in (
        (
            "sandboxtemplates",
            "adk-python",
            {
                "podTemplate": {
                    "metadata": {"labels": template["metadata"]["labels"]},
                    "spec": template["spec"],
                }
            },
        ),
        ("sandboxwarmpools", POOL, {"replicas": 0, "sandboxTemplateRef": {"name": "adk-python"}}),
        ("sandboxwarmpools", STRICT_POOL, {"replicas": 0, "sandboxTemplateRef": {"name": "adk-python"}}),
    ):
        kind = "SandboxTemplate" if plural == "sandboxtemplates" else "SandboxWarmPool"
        body: dict[str, Any] = {
            "apiVersion": "/".join(EXT),
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        try:
            custom.create_namespaced_custom_object(*EXT, NAMESPACE, plural, body)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
            old = custom.get_namespaced_custom_object(*EXT, NAMESPACE, plural, name)
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            custom.replace_namespaced_custom_object(*EXT, NAMESPACE, plural, name, body)
    running = _TestReconciler(NAMESPACE)
    running.start()
    yield running
    running.stop()
    assert not running.errors, running.errors


def _gone(read: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while read() is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_the_backend_sees_agent_sandboxs_crds_on_the_real_api_server(reconciler: _TestReconciler) -> None:
    with KubernetesBackend(_config(), context=CONTEXT) as backend:
        assert backend._api.has_claims()


def test_a_session_claimed_and_bound_by_the_test_reconciler_runs_in_its_pod_and_close_deletes_the_claim(
    reconciler: _TestReconciler,
) -> None:
    config = _config()
    with KubernetesBackend(config, context=CONTEXT) as backend:
        api = backend._api
        session = backend.session()
        with session:
            result = session.execute(
                ExecRequest(language=Language.COMMAND, code="id -u; hostname", timeout=30)
            )
            name = f"adk-sandbox-{session.session_id}"
            assert result.exit_code == 0, result.stderr
            assert result.stdout.split() == [
                str(config.uid),
                name,
            ]  # the Pod the Sandbox made, named after it
            assert session.pod_name == name

            claim = api.read_claim(NAMESPACE, name)
            assert claim is not None
            assert claim["metadata"]["labels"] == {
                "io.adk-sandbox.project": "adk-sandbox",
                "io.adk-sandbox.session": session.session_id,
            }
            spec = claim["spec"]
            assert spec["warmPoolRef"] == {"name": POOL}
            assert spec["lifecycle"]["shutdownPolicy"] == "Delete"
            shutdown = datetime.datetime.fromisoformat(spec["lifecycle"]["shutdownTime"])
            left = (shutdown - datetime.datetime.now(datetime.UTC)).total_seconds()
            assert config.active_deadline_seconds - 120 < left <= config.active_deadline_seconds
            extra = spec["additionalPodMetadata"]["labels"]
            assert extra["io.adk-sandbox.session"] == session.session_id and "env" not in spec
            status = claim["status"]
            assert status["sandbox"]["name"] == name and status["sandbox"]["podIPs"]
            (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
            assert (ready["status"], ready["reason"]) == ("True", "DependenciesReady")

            sandbox = api.read_sandbox(NAMESPACE, name)
            assert sandbox is not None
            assert sandbox["metadata"]["ownerReferences"][0]["uid"] == claim["metadata"]["uid"]
            pod = api.read_pod(NAMESPACE, name)
            assert pod is not None
            assert pod["metadata"]["ownerReferences"][0]["uid"] == sandbox["metadata"]["uid"]
            # The claim's labels reached the Pod: the API server took them as Pod label values.
            assert extra.items() <= pod["metadata"]["labels"].items()
        assert api.read_claim(NAMESPACE, name) is None  # deleted at close
        # The cluster's garbage collector follows the owner references: the Sandbox, then its Pod.
        assert _gone(lambda: api.read_sandbox(NAMESPACE, name))
        assert _gone(lambda: api.read_pod(NAMESPACE, name))


def test_a_claim_the_test_reconciler_refuses_fails_at_once_with_the_controllers_reason(
    reconciler: _TestReconciler,
) -> None:
    """The test reconciler checks the claim's labels as agent-sandbox's controller does by default: the
    project's label keys (``io.adk-sandbox.session``, no ``domain/`` prefix) are refused, InvalidMetadata."""
    with KubernetesBackend(_config(warm_pool=STRICT_POOL), context=CONTEXT) as backend:
        session = backend.session()
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as raised:
            session.start()
        assert time.monotonic() - started < 15  # not the 60 s startup timeout
        message = str(raised.value)
        assert f"the warm pool {STRICT_POOL} could not serve: InvalidMetadata" in message
        assert "must have a domain prefix" in message
        assert backend._api.read_claim(NAMESPACE, f"adk-sandbox-{session.session_id}") is None
        session.close()


@pytest.mark.parametrize(
    ("pool", "waiting"),
    [
        ("adk-no-such-pool", 'WarmPoolNotFound: SandboxWarmPool "adk-no-such-pool" not found'),
        (IGNORED_POOL, "the controller has not reported on it yet"),
    ],
)
def test_a_claim_the_test_reconciler_never_binds_times_out_naming_the_pool(
    reconciler: _TestReconciler, pool: str, waiting: str
) -> None:
    with KubernetesBackend(_config(warm_pool=pool, startup_timeout_seconds=3), context=CONTEXT) as backend:
        session = backend.session()
        with pytest.raises(BackendUnavailableError) as raised:
            session.start()
        assert str(raised.value) == f"the warm pool {pool} bound no sandbox within 3 s ({waiting})"
        assert backend._api.read_claim(NAMESPACE, f"adk-sandbox-{session.session_id}") is None
        session.close()
