"""The calls a session makes to the API server: :class:`KubernetesApi`, and the client that makes them.

The seam between the session's logic and the ``kubernetes`` client (imported here only, lazily: ``import
executor`` never needs the ``k8s`` extra). Objects go in and come out as plain JSON dicts, so the pure
modules read exactly what the API server stored. Every ``ApiException`` is mapped here, once, by
:func:`._failures.api_error`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from adk_sandbox.executor.backends.kubernetes._claim import (
    CLAIM_GROUP,
    CLAIM_PLURAL,
    CLAIM_VERSION,
    SANDBOX_GROUP,
    SANDBOX_PLURAL,
    SANDBOX_VERSION,
)
from adk_sandbox.executor.backends.kubernetes._exec import WebSocketClientAdapter, WebSocketLike
from adk_sandbox.executor.backends.kubernetes._failures import api_error
from adk_sandbox.executor.errors import BackendUnavailableError, ExecutorError

__all__ = ["ClientApi", "KubernetesApi"]


class KubernetesApi(Protocol):
    """What the Kubernetes backend asks of a cluster (JSON objects in and out; ``None``: not found)."""

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]: ...
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...
    def read_runtime_class(self, name: str) -> dict[str, Any] | None: ...
    def list_nodes(self) -> list[dict[str, Any]] | None: ...
    def apply_network_policy(self, namespace: str, policy: dict[str, Any]) -> dict[str, Any]: ...
    def has_claims(self) -> bool: ...
    def server_host(self) -> str | None: ...
    def create_claim(self, namespace: str, claim: dict[str, Any]) -> dict[str, Any]: ...
    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def delete_claim(self, namespace: str, name: str) -> None: ...
    def read_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def open_exec(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> WebSocketLike: ...


@contextlib.contextmanager
def _mapped(action: str, *, missing_ok: bool = False) -> Iterator[None]:
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - the optional k8s extra

    try:
        yield
    except ApiException as exc:
        if missing_ok and exc.status == 404:
            raise _NotFoundError from None
        raise api_error(int(exc.status or 0), exc.body or exc.reason, action) from exc
    except OSError as exc:  # urllib3's connection errors are OSErrors underneath
        raise api_error(0, str(exc), action) from exc


class _NotFoundError(Exception):
    pass


class ClientApi:
    """:class:`KubernetesApi` over the official client, for the kubeconfig ``context`` (None: current)."""

    def __init__(self, context: str | None = None) -> None:
        try:
            import kubernetes  # noqa: PLC0415 - the optional k8s extra
        except ImportError as exc:
            raise BackendUnavailableError(
                "the Kubernetes backend needs the kubernetes client: pip install 'adk-sandbox[k8s]'"
            ) from exc
        try:
            # Typed as Any: the objects cross this module as plain JSON dicts (the client accepts them),
            # which its generated model types do not express.
            self._client: Any = kubernetes.config.new_client_from_config(context=context)  # type: ignore[no-untyped-call]
        except Exception as exc:  # ConfigException, a missing file: the message says which
            raise BackendUnavailableError(
                f"no usable kubeconfig context {context or '(current)'}: {exc}; set KUBECONFIG or pass the "
                "name of a context from `kubectl config get-contexts`"
            ) from exc
        self._core: Any = kubernetes.client.CoreV1Api(self._client)
        self._node: Any = kubernetes.client.NodeV1Api(self._client)
        self._net: Any = kubernetes.client.NetworkingV1Api(self._client)
        self._custom: Any = kubernetes.client.CustomObjectsApi(self._client)
        self._apis: Any = kubernetes.client.ApisApi(self._client)
        # The client's stream() swaps its ApiClient's call_api for a websocket one while it connects: an
        # API call from another thread meanwhile (a pool filling, a session closing) would go out as a
        # websocket and fail. So exec connects through a client of its own, one at a time.
        self._exec_core: Any = kubernetes.client.CoreV1Api(
            kubernetes.client.ApiClient(self._client.configuration)
        )
        self._exec_lock = threading.Lock()

    def _json(self, obj: object) -> dict[str, Any]:
        value: dict[str, Any] = self._client.sanitize_for_serialization(obj)
        return value

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """POST the Pod; the Pod as stored (after admission)."""
        with _mapped("create the session Pod"):
            return self._json(self._core.create_namespaced_pod(namespace, pod))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET the Pod; None when gone."""
        try:
            with _mapped(f"read the Pod {name}", missing_ok=True):
                return self._json(self._core.read_namespaced_pod(name, namespace))
        except _NotFoundError:
            return None

    def delete_pod(self, namespace: str, name: str) -> None:
        """DELETE the Pod at once (grace 0); one already gone is not an error."""
        with contextlib.suppress(_NotFoundError), _mapped(f"delete the Pod {name}", missing_ok=True):
            self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """LIST the namespace's Pods that ``label_selector`` selects."""
        with _mapped("list the session Pods"):
            listed = self._json(self._core.list_namespaced_pod(namespace, label_selector=label_selector))
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    def list_nodes(self) -> list[dict[str, Any]] | None:
        """LIST the cluster's Nodes; None when the account may not (RBAC) or the server does not answer."""
        try:
            with _mapped("list the nodes"):
                listed = self._json(self._core.list_node())
        except ExecutorError:
            return None
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    def read_runtime_class(self, name: str) -> dict[str, Any] | None:
        """GET the RuntimeClass; None when there is none of that name."""
        try:
            with _mapped(f"read the RuntimeClass {name}", missing_ok=True):
                return self._json(self._node.read_runtime_class(name))
        except _NotFoundError:
            return None

    def apply_network_policy(self, namespace: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Create the policy, or replace one of that name; the policy as stored."""
        name = policy["metadata"]["name"]
        try:
            with _mapped("read the sandbox NetworkPolicy", missing_ok=True):
                existing = self._net.read_namespaced_network_policy(name, namespace)
        except _NotFoundError:
            with _mapped("create the sandbox NetworkPolicy"):
                return self._json(self._net.create_namespaced_network_policy(namespace, policy))
        body = {
            **policy,
            "metadata": {**policy["metadata"], "resourceVersion": existing.metadata.resource_version},
        }
        with _mapped("update the sandbox NetworkPolicy"):
            return self._json(self._net.replace_namespaced_network_policy(name, namespace, body))

    def server_host(self) -> str | None:
        """The API server's host name or address (its addresses are refused to the Pods' connections)."""
        return urlsplit(str(self._client.configuration.host)).hostname

    def has_claims(self) -> bool:
        """True when the API server serves agent-sandbox's SandboxClaim (its CRDs are installed)."""
        with _mapped("list the API groups"):
            groups = self._apis.get_api_versions().groups or []
        return any(
            group.name == CLAIM_GROUP and any(v.version == CLAIM_VERSION for v in group.versions or [])
            for group in groups
        )

    def create_claim(self, namespace: str, claim: dict[str, Any]) -> dict[str, Any]:
        """POST the SandboxClaim."""
        with _mapped("claim a sandbox from the warm pool"):
            created: dict[str, Any] = self._custom.create_namespaced_custom_object(
                CLAIM_GROUP, CLAIM_VERSION, namespace, CLAIM_PLURAL, claim
            )
        return created

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET the SandboxClaim; None when gone."""
        try:
            with _mapped(f"read the SandboxClaim {name}", missing_ok=True):
                claim: dict[str, Any] = self._custom.get_namespaced_custom_object(
                    CLAIM_GROUP, CLAIM_VERSION, namespace, CLAIM_PLURAL, name
                )
                return claim
        except _NotFoundError:
            return None

    def delete_claim(self, namespace: str, name: str) -> None:
        """DELETE the SandboxClaim (its Sandbox and Pod go with it)."""
        with contextlib.suppress(_NotFoundError), _mapped(f"delete the SandboxClaim {name}", missing_ok=True):
            self._custom.delete_namespaced_custom_object(
                CLAIM_GROUP, CLAIM_VERSION, namespace, CLAIM_PLURAL, name
            )

    def read_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET the Sandbox; None when gone."""
        try:
            with _mapped(f"read the Sandbox {name}", missing_ok=True):
                sandbox: dict[str, Any] = self._custom.get_namespaced_custom_object(
                    SANDBOX_GROUP, SANDBOX_VERSION, namespace, SANDBOX_PLURAL, name
                )
                return sandbox
        except _NotFoundError:
            return None

    def open_exec(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> WebSocketLike:
        """Open ``pods/exec`` with stdin, offering v5 then v4; the websocket (not yet read)."""
        from kubernetes.stream import stream  # noqa: PLC0415 - the optional k8s extra

        with self._exec_lock, _mapped(f"exec into the Pod {pod}"):
            client = stream(
                self._exec_core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=list(argv),
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                # The client offers "v5.channel.k8s.io,v4.channel.k8s.io" (SUBPROTOCOLS) itself.
                _preload_content=False,
            )
        return WebSocketClientAdapter(client.sock, client.subprotocol)
