"""A Kubernetes API whose Pods are real hardened Docker containers: a stand-in for a cluster, for tests.

No cluster can exist on these machines (docs/KUBERNETES.md), so :class:`DockerPodApi` plays the API
server and the kubelet: ``create_pod`` starts a local container *made from the Pod spec it is given* (its
image, command, user, working directory, environment, read-only root, dropped capabilities,
``allowPrivilegeEscalation: false`` as ``no-new-privileges``, memory and cpu limits, and every
memory-backed ``emptyDir`` as a tmpfs of its ``sizeLimit`` at its ``mountPath``), with no network;
``read_pod`` answers the Pod as stored with a recorded Running status; ``delete_pod`` removes the container.

``open_exec`` is ``pods/exec``: a real ``docker exec`` into that container (stdin attached, as the Pod's
user, in its working directory, as an exec into a Pod runs; opened with the Docker backend's own exec
upgrade, which bounds every daemon call by a deadline, rather than docker-py's ``exec_start(socket=True)``,
whose reads wait a fixed minute), wrapped by :class:`DockerExecWebSocket` in
the ``v5.channel.k8s.io`` framing a real API server speaks: each message a channel byte (1 stdout, 2
stderr, 3 the final metav1.Status JSON) and its data; stdin messages (channel 0) are written to the exec,
and v5's close of stdin (``[255, 0]``) half-closes it. So the session's ``ExecBridge``, the agent channel
over it and everything above run unchanged, against a real sandbox.

Not stood in for: the API server's admission, the kubelet's own mount options, a CNI, RuntimeClasses.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from adk_sandbox.executor.backends.docker._daemon import engine_of
from adk_sandbox.executor.backends.docker._exec import DockerExecs, DockerStreamSplitter
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
from adk_sandbox.executor.backends.kubernetes._channel import CLOSE, ERROR, STDIN, ChannelProtocol
from adk_sandbox.executor.backends.kubernetes._exec import WebSocketLike
from tests.conftest import require
from tests.k8s_api_stubs import ClusterWithoutClaims

__all__ = ["STANDIN_LABEL", "DockerExecWebSocket", "DockerPodApi", "backend_on", "docker_pod_api"]

#: Marks the containers standing in for Pods (the tests remove every one they made).
STANDIN_LABEL = "io.adk-sandbox.test.k8s-standin"
_RUNNING = json.loads(
    (Path(__file__).parents[1] / "unit" / "fixtures" / "k8s" / "pod_runc_running.json").read_text()
)["status"]


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity  # pod_spec writes every size in Mi
    return int(quantity.removesuffix("Mi"))


def _millicores(quantity: str) -> int:
    assert quantity.endswith("m"), quantity
    return int(quantity.removesuffix("m"))


def container_options(pod: dict[str, Any]) -> dict[str, Any]:
    """``docker run`` options of the one container of ``pod`` (see the module docstring)."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    tmpfs = {}
    for mount in container["volumeMounts"]:
        empty = volumes[mount["name"]]["emptyDir"]
        assert empty["medium"] == "Memory" and not mount.get("readOnly"), mount
        # The kubelet makes an emptyDir's directory 0777; memory-backed, its size is the sizeLimit.
        tmpfs[mount["mountPath"]] = f"rw,exec,size={_mebibytes(empty['sizeLimit'])}m,mode=0777"
    limits = container["resources"]["limits"]
    assert "ALL" in context["capabilities"]["drop"]
    return {
        "image": container["image"],
        "entrypoint": container["command"],
        "user": f"{context['runAsUser']}:{context['runAsGroup']}",
        "working_dir": container["workingDir"],
        "environment": {item["name"]: item["value"] for item in container.get("env", [])},
        "read_only": context["readOnlyRootFilesystem"],
        "cap_drop": ["ALL"],
        "security_opt": [] if context["allowPrivilegeEscalation"] else ["no-new-privileges"],
        "privileged": bool(context.get("privileged")),
        "network_mode": "none",
        "mem_limit": f"{_mebibytes(limits['memory'])}m",
        "nano_cpus": _millicores(limits["cpu"]) * 1_000_000,
        "tmpfs": tmpfs,
        "labels": {STANDIN_LABEL: pod["metadata"]["name"]},
        "detach": True,
    }


class DockerExecWebSocket:
    """:class:`WebSocketLike` of one ``pods/exec``, over a real ``docker exec`` (v5 framing)."""

    subprotocol = ChannelProtocol.V5.value

    def __init__(self, client: docker.DockerClient, container_id: str, argv: Sequence[str]) -> None:
        self._client = client
        self._exec = DockerExecs(client, container_id, engine_of(client))
        until = time.monotonic() + 30
        # User "" and workdir "": the container's own, as an exec into a Pod cannot choose them.
        self._exec_id = self._exec._create_exec(list(argv), "", "", True, until)
        self._sock, early = self._exec._start_exec(self._exec_id, until)
        self._splitter = DockerStreamSplitter()
        self._pending: deque[bytes] = deque()
        self._queue(early)
        self._ended = False
        self.stdin_closed = False

    def _queue(self, data: bytes) -> None:
        for stream, piece in self._splitter.feed(data):
            self._pending.append(bytes([stream]) + piece)

    def send_binary(self, data: bytes) -> None:
        """A client message: stdin data (channel 0), or v5's close of stdin."""
        if data[:1] == bytes([STDIN]):
            self._sock.sendall(data[1:])
        elif data == bytes([CLOSE, STDIN]):
            self.stdin_closed = True
            self._sock.shutdown(socket.SHUT_WR)  # the exec's stdin ends, its output goes on
        else:
            raise AssertionError(f"a client message no exec client sends: {data[:16]!r}")

    def recv_message(self) -> bytes | None:
        """The next server message: output, then the Status once the exec ended; None after that."""
        while not self._pending:
            if self._ended:
                return None
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if chunk:
                self._queue(chunk)
                continue
            self._ended = True
            self._pending.append(bytes([ERROR]) + json.dumps(self._status()).encode())
        return self._pending.popleft()

    def _status(self) -> dict[str, Any]:
        """The metav1.Status the API server sends on channel 3 for the exec's exit status."""
        try:
            code = self._exit_code()
        except Exception as exc:  # the container is gone: what the server says then
            return {"status": "Failure", "reason": "InternalError", "message": str(exc)}
        if code == 0:
            return {"status": "Success"}
        return {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }

    def _exit_code(self) -> int | None:
        """The exec's exit status once the engine marks it ended (None if it does not within 5 s)."""
        give_up = time.monotonic() + 5.0
        while True:
            found = self._client.api.exec_inspect(self._exec_id)
            if not found.get("Running"):
                code = found.get("ExitCode")
                return int(code) if code is not None else None
            if time.monotonic() > give_up:
                return None
            time.sleep(0.005)

    def close(self) -> None:
        """Close the connection (unblocks a pending :meth:`recv_message`)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class DockerPodApi(ClusterWithoutClaims):
    """``KubernetesApi`` whose Pods are local containers (see the module docstring); records the calls.

    Its NetworkPolicies are stored as given: the container has no network, so the in-Pod probe finds no
    route.
    """

    def __init__(self, client: docker.DockerClient) -> None:
        super().__init__()
        self.client = client
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.containers: dict[str, str] = {}
        """The container standing in for each Pod, by Pod name."""
        self.execs: list[DockerExecWebSocket] = []

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """Start the Pod's container."""
        name = pod["metadata"]["name"]
        self.created.append(pod)
        container = self.client.containers.run(**container_options(pod), name=f"k8s-standin-{name}")
        self.containers[name] = container.id
        return pod

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as created, Running (None once deleted)."""
        pods = [pod for pod in self.created if pod["metadata"]["name"] == name]
        if not pods or name in self.deleted:
            return None
        return {**pods[-1], "status": _RUNNING}

    def delete_pod(self, namespace: str, name: str) -> None:
        """Remove the Pod's container."""
        self.deleted.append(name)
        container = self.containers.get(name)
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_container(container, force=True)

    def open_exec(self, namespace: str, pod: str, container: str, argv: Sequence[str]) -> WebSocketLike:
        """``pods/exec`` into the Pod's container: a real docker exec in the v5 framing."""
        assert pod not in self.deleted and container == "sandbox", (pod, container)
        websocket = DockerExecWebSocket(self.client, self.containers[pod], argv)
        self.execs.append(websocket)
        return websocket

    def remove_all(self) -> None:
        """Remove every container this API started (whatever the session did)."""
        for container in self.containers.values():
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_container(container, force=True)


@contextlib.contextmanager
def docker_pod_api() -> Iterator[DockerPodApi]:
    """A :class:`DockerPodApi` on the local engine (fails in CI without one); its containers removed after."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        require(False, f"the Docker engine is not usable here: {exc}")
        raise
    images = {tag for image in client.images.list() for tag in image.tags}
    require(BASE_IMAGE in images, f"{BASE_IMAGE} is missing: run `adk-sandbox images build`")
    api = DockerPodApi(client)
    try:
        yield api
    finally:
        api.remove_all()
        left = [c.id for c in client.containers.list(all=True, filters={"label": STANDIN_LABEL})]
        client.close()
    assert not set(left) & set(api.containers.values()), "a stand-in Pod's container was left"


def backend_on(api: DockerPodApi, workspace_mb: int = 64) -> KubernetesBackend:
    """A Kubernetes backend whose Pods are local base-image containers (the emptyDir: ``workspace_mb``)."""
    return KubernetesBackend(KubernetesConfig(image=BASE_IMAGE, workspace_mb=workspace_mb), api=api)
