"""KubernetesBackend: one hardened Pod per session (from its own pool, or claimed from agent-sandbox's).

Run in CI against a real one-node cluster (v1.28, ``../shared/k8s``; tests/integration/test_k8s_cluster*.py
and the conformance suite); a stand-in whose Pods are Docker containers made from the Pod spec stays for
what only it can do (faults, recorded traffic). docs/KUBERNETES.md has the whole design.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adk_sandbox.executor._languages import LANGUAGES
from adk_sandbox.executor._layout import HOME_DIR
from adk_sandbox.executor._owner import owner_labels
from adk_sandbox.executor.backend import SessionBackend
from adk_sandbox.executor.backends.kubernetes._api import ClientApi, KubernetesApi
from adk_sandbox.executor.backends.kubernetes._claim import claim_object, claim_state, sandbox_pod_name
from adk_sandbox.executor.backends.kubernetes._exec import ExecBridge
from adk_sandbox.executor.backends.kubernetes._failures import (
    capacity_text,
    never_schedulable,
    pod_failure,
    pod_waiting_reason,
)
from adk_sandbox.executor.backends.kubernetes._reaper import LeakedPod, reap_leaked_pods
from adk_sandbox.executor.backends.kubernetes._spec import (
    CONTAINER_NAME,
    capabilities_from_pod,
    network_policy,
    network_policy_in_force,
    network_probe_argv,
    network_probe_found_no_route,
    network_probe_targets,
    pod_name,
    pod_resources,
    pod_spec,
    pod_violations,
)
from adk_sandbox.executor.backends.kubernetes.config import KubernetesConfig
from adk_sandbox.executor.backends.kubernetes.pool import KubernetesPool, KubernetesPoolConfig
from adk_sandbox.executor.channel.agent_transport import AgentTransport
from adk_sandbox.executor.channel.egress import SessionEgress, SessionNetwork, check_network_argument
from adk_sandbox.executor.channel.probe import verify_from_inside
from adk_sandbox.executor.channel.session import ChannelSession
from adk_sandbox.executor.channel.transport import DEFAULT_PATH
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.types import Capabilities, ExecRequest, Language
from adk_sandbox.executor.workspace.mirror import MirrorWorkspace
from adk_sandbox.executor.workspace.synced import SyncChannel, SyncedWorkspace

__all__ = ["KubernetesBackend", "KubernetesSession", "workspace_config"]

log = logging.getLogger(__name__)

#: How often a starting Pod (or claim) is read.
POLL_SECONDS = 0.25
_PROGRAM_LANGUAGES = {LANGUAGES[lang].program: lang for lang in (Language.PYTHON, Language.JAVASCRIPT)}
_PROBE_LANGUAGES = (
    f"for p in {' '.join(_PROGRAM_LANGUAGES)}; do command -v $p >/dev/null 2>&1 && echo $p; done"
)


class KubernetesSession(SessionNetwork, ChannelSession):
    """One Pod for the whole session: created (or claimed) at entry, reused, deleted at close.

    Commands reach it through the agent channel over ``pods/exec``, as the Pod's user (another ``user`` is
    refused), with a cleared environment. A broken Pod fails the command with the reason its status gives; the
    session does not replace it. A host ``workspace`` is mirrored into the Pod's ``emptyDir`` at the same path
    (:func:`workspace_config`); a :class:`~adk_sandbox.executor.network.NetworkPolicy` is served by a proxy
    over the same channel (:meth:`set_network` switches it). Depth: docs/KUBERNETES.md.
    """

    name = "kubernetes"
    _GONE = "this Kubernetes session is closed"
    _WHERE = "the Kubernetes session's Pod"
    _NO_BACKGROUND = (
        "background=True is for Docker sessions on the agent channel; a Kubernetes session kills what a "
        "command leaves running when it ends. Nothing ran"
    )

    def __init__(
        self,
        api: KubernetesApi,
        config: KubernetesConfig,
        *,
        network_policy_ready: Callable[[], Any] | None = None,
        workspace: str | None = None,
    ) -> None:
        if workspace is not None and config.workspace_path != workspace:
            raise ValueError("a host workspace must be the config's workspace_path (see workspace_config)")
        self._api = api
        self._config = config
        self._workspace_root = workspace
        self._workspace: SyncedWorkspace | None = None
        self._policy_ready = network_policy_ready
        self._session_id = uuid.uuid4().hex[:12]
        self.pod_name: str | None = None
        """The session Pod's name, once it exists."""
        self._claim: str | None = None
        # Reentrant: the start probes the network with execute(), which starts the session (a no-op by then).
        self._lock = threading.RLock()
        self._pod: dict[str, Any] | None = None
        self._runtime_class: dict[str, Any] | None = None
        self._transport: AgentTransport | None = None
        self._bridges: list[ExecBridge] = []
        self._closed = False
        self._capabilities: Capabilities | None = None
        self._network_denied = False
        server = api.server_host()  # its addresses are refused to the proxied connections
        self._egress = SessionEgress(config.network, engine_hosts=(server,) if server else ())
        self._user = config.user
        self._base_env = {"PATH": DEFAULT_PATH, "HOME": HOME_DIR}
        self._enterable: set[tuple[str, str]] = set()
        self._nodes_checked = False

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        """The session's id: the ``io.adk-sandbox.session`` label of its Pod (and claim)."""
        return self._session_id

    @property
    def workspace(self) -> str | None:
        """The host directory of the session's workspace (absolute, resolved; the same path in the Pod)."""
        return self._workspace_root

    @property
    def workspace_transport(self) -> str | None:
        """How the host workspace reaches the Pod: ``"mirror"`` (None: no host workspace)."""
        return "mirror" if self._workspace_root is not None else None

    @property
    def mirror(self) -> MirrorWorkspace | None:
        """The mirrored workspace (its ``refused`` says what the last pull-back left), once started."""
        return self._workspace.mirror if self._workspace is not None else None

    def push_workspace(self) -> None:
        """Bring the host copy's changes into the Pod now (what the next command does first); starts it."""
        self.start()
        if self._workspace is not None:
            self._workspace.before_command()

    def _open(self) -> None:
        """Create (or claim) the Pod, wait until it runs, verify it, start the agent (see ``start``)."""
        config = self._config
        session = owner_labels(self.session_id, config.active_deadline_seconds)
        name = pod_name(self.session_id)
        policy = self._policy_ready() if self._policy_ready is not None else None
        deadline = time.monotonic() + config.startup_timeout_seconds
        if config.warm_pool is not None:
            self._claim = name
            now = datetime.datetime.now(datetime.UTC)
            self._api.create_claim(config.namespace, claim_object(config, name, session, now=now))
            self.pod_name = self._wait_for_claim(name, deadline)
        else:
            self.pod_name = name
            self._api.create_pod(config.namespace, pod_spec(config, session, name))
        pod = self._wait_running(self.pod_name, deadline)
        problems = pod_violations(pod, config)
        if problems:
            raise PolicyNotEnforceableError(
                f"the session Pod {self.pod_name} is not hardened as required (changed by admission, or a "
                "warm pool whose template is not pod_spec(config)): " + "; ".join(problems)
            )
        runtime = (pod.get("spec") or {}).get("runtimeClassName")
        self._runtime_class = self._api.read_runtime_class(runtime) if runtime else None
        self._pod = pod
        self._transport = AgentTransport(self._open_stream)
        verify_from_inside(self._transport, dict(self._base_env), config.user, None)
        if self._egress.proxied:
            self._egress.serve(self._transport, config.user)
        if self._workspace_root is not None:
            try:
                info = os.stat(self._workspace_root)
                mirror = MirrorWorkspace(
                    self._workspace_root,
                    config.workspace_mb,
                    (info.st_uid, info.st_gid),  # what pull-back creates on the host is the workspace owner's
                    cap_setting="KubernetesConfig(workspace_mb=...)",
                )
            except OSError as exc:
                raise InvalidRequestError(
                    f"the workspace directory {self._workspace_root} cannot be opened ({exc.strerror}); "
                    "nothing ran"
                ) from exc
            self._workspace = SyncedWorkspace(mirror, self._sync_channel)
            self._workspace.started()
        if config.network is not True:  # off or a policy: the default-deny NetworkPolicy selects the Pod
            self._network_denied = network_policy_in_force(policy, pod) and self._probe_network()

    def _sync_channel(self) -> SyncChannel | None:
        """Where a workspace sync step runs: the Pod's agent channel, as the Pod's user."""
        transport = self._transport
        return SyncChannel(transport, self._base_env, self._config.user) if transport is not None else None

    def _wait_for_claim(self, name: str, deadline: float) -> str:
        namespace = self._config.namespace
        while True:
            claim = self._api.read_claim(namespace, name)
            if claim is None:
                raise SandboxFailedError(f"the SandboxClaim {name} vanished while it was being bound")
            state = claim_state(claim)
            if state.failure:
                raise BackendUnavailableError(
                    f"the warm pool {self._config.warm_pool} could not serve: {state.failure}"
                )
            if state.ready and state.sandbox:
                sandbox = self._api.read_sandbox(namespace, state.sandbox)
                if sandbox is not None:
                    return sandbox_pod_name(sandbox)
            if time.monotonic() >= deadline:
                raise BackendUnavailableError(
                    f"the warm pool {self._config.warm_pool} bound no sandbox within "
                    f"{self._config.startup_timeout_seconds:g} s ({state.waiting or 'no sandbox yet'})"
                )
            time.sleep(POLL_SECONDS)

    def _wait_running(self, name: str, deadline: float) -> dict[str, Any]:
        while True:
            pod = self._api.read_pod(self._config.namespace, name)
            if pod is None:
                raise SandboxFailedError(f"the session Pod {name} vanished while it was starting")
            failure = pod_failure(pod) or self._never_schedulable(pod)
            if failure is not None:
                raise failure
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            if (pod.get("status") or {}).get("phase") == "Running" and any(
                s.get("name") == CONTAINER_NAME and (s.get("state") or {}).get("running") for s in statuses
            ):
                return pod
            if time.monotonic() >= deadline:
                capacity = capacity_text(self._api.list_nodes()) if pod_waiting_reason(pod) else ""
                raise BackendUnavailableError(
                    f"the session Pod {name} did not start within "
                    f"{self._config.startup_timeout_seconds:g} s: {pod_waiting_reason(pod)}"
                    + (f" ({capacity}; each session requests {self._requests_text()})" if capacity else "")
                )
            time.sleep(POLL_SECONDS)

    def _never_schedulable(self, pod: dict[str, Any]) -> ExecutorError | None:
        """Checked once per start, when the scheduler first says the Pod does not fit."""
        if self._nodes_checked or not pod_waiting_reason(pod).startswith("it is not scheduled"):
            return None
        self._nodes_checked = True
        return never_schedulable(pod, self._api.list_nodes())

    def _requests_text(self) -> str:
        requests = pod_resources(self._config)["requests"]
        return f"cpu {requests['cpu']}, memory {requests['memory']} (KubernetesConfig.requests)"

    def _open_stream(self, argv: list[str], user: str, until: float) -> ExecBridge:
        assert self.pod_name is not None  # noqa: S101 - the transport exists only once the Pod does
        websocket = self._api.open_exec(self._config.namespace, self.pod_name, CONTAINER_NAME, argv)
        bridge = ExecBridge(websocket)
        self._bridges = [b for b in self._bridges if b.status is None] + [bridge]
        return bridge

    def _probe_network(self) -> bool:
        targets = network_probe_targets(self._pod or {})
        probe = self.execute(ExecRequest(argv=network_probe_argv(targets), timeout=30))
        found = network_probe_found_no_route(probe.stdout, targets)
        if not found:
            log.warning("the default-deny NetworkPolicy does not stop traffic from Pod %s: %s", self.pod_name,
                        probe.stdout.strip() or probe.stderr.strip())  # fmt: skip
        return found

    def _discard(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        for bridge in self._bridges:
            bridge.disconnect()
        self._bridges = []
        namespace = self._config.namespace
        if self._claim is not None:
            claim, self._claim = self._claim, None
            self._api.delete_claim(namespace, claim)
        elif self.pod_name is not None:
            self._api.delete_pod(namespace, self.pod_name)
        self._pod = None
        if self._workspace is not None:
            self._workspace.close()  # after any last pull-back (close), or a start that failed

    def _close_sandbox(self) -> None:
        """Bring a host workspace's last changes back, then delete the Pod (or the claim). Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._transport is not None and self._workspace is not None:
                    self._workspace.closing()
            finally:  # whatever the last pull-back raised, the Pod goes
                self._closed = True
                self._discard()

    # -- what is enforced ----------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """What the running Pod enforces, from the stored Pod, its RuntimeClass and the in-Pod probes."""
        self.start()
        if self._capabilities is None:
            probe = self.execute(ExecRequest(language=Language.COMMAND, code=_PROBE_LANGUAGES, timeout=30))
            found = [_PROGRAM_LANGUAGES[word] for word in probe.stdout.split() if word in _PROGRAM_LANGUAGES]
            assert self._pod is not None  # noqa: S101 - started above
            self._capabilities = capabilities_from_pod(
                self._pod,
                self._runtime_class,
                (Language.COMMAND, *found),
                network_denied=self._network_denied,
            ).model_copy(update={"workspace": self.workspace_transport})
        return self._capabilities.model_copy(update={"network_policy": self._egress.policy})

    # -- the network (docs/network.md) ---------------------------------------------------------------
    def set_network(self, network: bool | NetworkPolicy) -> None:
        """Change the sandbox's network while it runs (docs/network.md, "Changing it at run time").

        ``False``: every live proxied connection is closed and new ones get a 403 (rule ``network off``);
        a :class:`NetworkPolicy`: it replaces the policy, and the open connections it does not allow (or
        whose name it pins elsewhere) are closed. Whether the default-deny NetworkPolicy selects the Pod is
        fixed when the Pod is made (its label), so a Pod made with ``network=True`` keeps the cluster
        network (only ``True`` is accepted), and a Pod made with ``False`` or a policy cannot be given it:
        those are refused with :class:`PolicyNotEnforceableError`. Starts the session (a policy needs its
        agent).
        """
        check_network_argument(network)
        route = self._config.network is True
        if route or network is True:
            if network is True and route:
                return
            if route:
                raise PolicyNotEnforceableError(
                    "this session's Pod has the cluster network (KubernetesConfig(network=True)), which "
                    "cannot be taken from a running Pod here; create the backend with network=False or a "
                    "NetworkPolicy to switch between them at run time"
                )
            raise PolicyNotEnforceableError(
                "a Pod started without a route out (the default-deny NetworkPolicy selects it) cannot be "
                "given the cluster network (network=True) while it runs; switch between False and a "
                "NetworkPolicy, or create the backend with KubernetesConfig(network=True)"
            )
        with self._lock:
            self.start()
            self._egress.switch(network, self._transport, self._config.user)

    # -- commands (the body is ChannelSession.execute) -------------------------------------------------
    def _refuse_user(self, user: str | None) -> None:
        # An exec into a Pod runs as the Pod's user: no other can be switched to.
        if user is not None and self._command_user(user) != self._user:
            raise PolicyNotEnforceableError(
                f"a Kubernetes session runs commands as its Pod's user {self._user}; pods/exec cannot "
                f"run as {user} (set KubernetesConfig(user=...) instead)"
            )

    def _memory_limit_mb(self) -> int:
        return self._config.limits.memory_mb

    def _working_directory(self) -> tuple[str, str]:
        return self.pod_name or "", self._config.workspace_path

    def _explained(self, exc: SandboxFailedError) -> ExecutorError:
        """The agent channel broke: the Pod's status says why when the Pod itself failed."""
        if self.pod_name is None:
            return exc
        try:
            pod = self._api.read_pod(self._config.namespace, self.pod_name)
        except ExecutorError:
            return exc
        if pod is None:
            return SandboxFailedError(f"the session Pod {self.pod_name} was deleted ({exc})")
        failure = pod_failure(pod)
        if failure is not None:
            return failure
        try:  # the Pod looks well: is its node's kubelet there to reach it? (the API learns in ~40 s)
            self._api.open_exec(self._config.namespace, self.pod_name, CONTAINER_NAME, ["true"]).close()
        except ExecutorError as lost:
            node = (pod.get("spec") or {}).get("nodeName", "?")
            return SandboxFailedError(f"the session Pod {self.pod_name} on node {node}: {lost}")
        return exc


class KubernetesBackend(SessionBackend[KubernetesSession]):
    """Creates :class:`KubernetesSession` s: one hardened Pod per session (docs/KUBERNETES.md).

    >>> config = KubernetesConfig(image="registry.example/adk-sandbox/base:1")  # doctest: +SKIP
    >>> with KubernetesBackend(config).session() as session:                    # doctest: +SKIP
    ...     session.execute(ExecRequest(language="command", code="id -u", timeout=10)).stdout

    The Pod is :func:`~adk_sandbox.executor.backends.kubernetes.pod_spec` of the config. ``pool=N`` keeps
    that many sessions started (:mod:`.pool`); ``warm_pool`` claims sessions from agent-sandbox's pool;
    ``session(workspace=dir)`` mirrors ``dir`` into the Pod (not with ``warm_pool``).
    """

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig | None = None,
        *,
        context: str | None = None,
        api: KubernetesApi | None = None,
        pool: int | KubernetesPoolConfig | None = None,
    ) -> None:
        """Connect with the kubeconfig ``context`` (None: the current one), or use ``api`` (tests).

        ``pool`` keeps that many sessions (or as a :class:`KubernetesPoolConfig` says) started for
        ``session()`` without a workspace (docs/KUBERNETES.md, "The pool"); not with ``warm_pool``.
        """
        self.config = config or KubernetesConfig()
        """The configuration every session Pod is made from."""
        self._api: KubernetesApi = api if api is not None else ClientApi(context or self.config.context)
        if self.config.warm_pool is not None and not self._api.has_claims():
            raise BackendUnavailableError(
                f"warm_pool={self.config.warm_pool!r} needs agent-sandbox's CRDs (extensions.agents.x-k8s.io "
                "v1beta1 SandboxClaim), which this cluster does not serve; install agent-sandbox with its "
                "extensions, or leave warm_pool unset to create Pods"
            )
        super().__init__()
        self._policy: dict[str, Any] | None = None
        self.reaped: list[LeakedPod] = self._reap()
        """The leaked session Pods this backend's start deleted (see :mod:`._reaper`)."""
        if pool is not None and self.config.warm_pool is not None:
            raise InvalidRequestError(
                "pool= keeps Pods this process started; warm_pool= claims them from agent-sandbox's "
                "controller: choose one"
            )
        settings = KubernetesPoolConfig(size=pool) if isinstance(pool, int) else pool
        self.pool: KubernetesPool | None = None
        """The started sessions kept ready (``pool=``), else None."""
        if settings is not None:
            self.pool = KubernetesPool(settings, self._pool_member)

    def _pool_member(self) -> KubernetesSession:
        return KubernetesSession(self._api, self.config, network_policy_ready=self._network_policy)

    def close(self) -> None:
        """Close every session of this backend still open (their Pods deleted), then the pool's Pods."""
        super().close()
        if self.pool is not None:
            self.pool.close()

    def _reap(self) -> list[LeakedPod]:
        """Delete the namespace's leaked session Pods, as the Docker backend does with its containers.

        A protection, not a requirement: where the account may not list Pods (RBAC), the start goes on
        with a warning; ``activeDeadlineSeconds`` still bounds every leak.
        """
        namespace = self.config.namespace
        try:
            removed = reap_leaked_pods(self._api, namespace)
        except ExecutorError as exc:
            log.warning("leaked session Pods in %s were not looked for: %s", namespace, exc)
            return []
        for pod in removed:
            log.info("deleted leaked session Pod %s/%s: %s", namespace, pod.name, pod.reason)
        return removed

    def _network_policy(self) -> dict[str, Any] | None:
        """The namespace's default-deny policy as stored, created on first use (network off only)."""
        if self.config.network is True:
            return None
        with self._lock:
            if self._policy is None:
                self._policy = self._api.apply_network_policy(
                    self.config.namespace, network_policy(self.config)
                )
            return self._policy

    def session(self, workspace: str | os.PathLike[str] | None = None) -> KubernetesSession:
        """A new session (its Pod starts on entry or first use), with a copy of ``workspace`` if given.

        The host directory ``workspace`` is mirrored into the Pod's workspace ``emptyDir``, mounted at the
        directory's own absolute path (:class:`KubernetesSession`); refused with ``warm_pool`` set (the
        pool's Pod template fixes where the workspace is mounted).
        """
        config, root = self.config, None
        if workspace is not None:
            if config.warm_pool is not None:
                raise InvalidRequestError(
                    f"a session claimed from the warm pool {config.warm_pool!r} cannot have a host "
                    "workspace: the pool's Pod template fixes where its workspace emptyDir is mounted "
                    f"({config.workspace_path}), and a host workspace goes at its own path in the Pod (as "
                    "Docker's warm pool gives no bind mount). Open session() without a workspace, or use a "
                    "KubernetesConfig without warm_pool"
                )
            config, root = workspace_config(config, workspace)
        elif self.pool is not None:
            return self._track(self.pool.acquire())
        return self._track(
            KubernetesSession(self._api, config, network_policy_ready=self._network_policy, workspace=root)
        )

    def _probe_capabilities(self) -> Capabilities:
        """What a session Pod of this backend enforces, read from a real one.

        ``workspace`` is how a session's host workspace would reach its Pod: ``"mirror"`` (the only way),
        None with a warm pool (which refuses one).
        """
        mode = None if self.config.warm_pool is not None else "mirror"
        return super()._probe_capabilities().model_copy(update={"workspace": mode})


def workspace_config(
    config: KubernetesConfig, workspace: str | os.PathLike[str]
) -> tuple[KubernetesConfig, str]:
    """``config`` with its workspace at the host directory ``workspace``'s resolved path, and that path.

    The Pod's workspace ``emptyDir`` and working directory go there, so the copy is at the same absolute
    path as on the host (what the project's sessions promise). :class:`InvalidRequestError` for a path
    that is no directory, or that a Pod cannot mount (``/tmp``, HOME, in ``/proc``, ``/sys``, ``/dev``).
    """
    root = str(Path(workspace).resolve(strict=False))
    if not os.path.isdir(root):
        raise InvalidRequestError(f"workspace {str(workspace)!r} is not a directory")
    try:
        root.encode("utf-8")
    except UnicodeEncodeError:  # a Pod spec is JSON: its paths are text
        raise InvalidRequestError(
            f"workspace {root!r} is not valid UTF-8, which a Pod's mount path must be; rename it"
        ) from None
    try:
        return KubernetesConfig.model_validate({**config.model_dump(), "workspace_path": root}), root
    except ValidationError as exc:
        why = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        raise InvalidRequestError(
            f"workspace {root!r} cannot be the session Pod's workspace: {why}"
        ) from None
