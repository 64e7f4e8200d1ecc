"""The one place that talks to the Docker daemon's client library: connecting, retrying, mapping errors.

Every docker-py call of the backend goes through :func:`daemon_errors`, so a caller only ever sees this
library's exceptions (:mod:`executor.errors`), and through :func:`idempotent` when repeating it is safe
(ping, create with a fixed name, inspect, remove). User commands are never retried: a command that may
have started is never started again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import docker
import docker.errors
import requests
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from executor.errors import BackendUnavailableError, ExecutorError, SandboxFailedError

__all__ = [
    "DEFAULT_SOCKET",
    "HOW_TO_START_DOCKER",
    "connect",
    "daemon_errors",
    "daemon_socket_path",
    "idempotent",
    "map_docker_error",
    "remove_container",
]

DEFAULT_SOCKET = "/var/run/docker.sock"

HOW_TO_START_DOCKER = (
    "start the Docker engine: `sudo systemctl start docker`, or `sudo dockerd &` where there is no "
    "systemd, or run this project's `scripts/setup` (it installs and starts one on Debian as root)"
)

#: Longest time an idempotent daemon call is retried before its error is raised.
RETRY_BUDGET_SECONDS = 10.0

T = TypeVar("T")


def daemon_socket_path() -> str:
    """The Unix socket of the local daemon (``DOCKER_HOST=unix://...`` or the default).

    The backend needs a *local* daemon: the workspace is bind-mounted by its host path, and command
    streams are read straight from the socket. A TCP or SSH ``DOCKER_HOST`` is refused with a clear error.
    """
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host.removeprefix("unix://")
    raise BackendUnavailableError(
        f"DOCKER_HOST={host!r} is not a local Unix socket; the Docker backend bind-mounts host paths and "
        "needs the daemon on this machine (unset DOCKER_HOST or point it at unix:///var/run/docker.sock)"
    )


def map_docker_error(exc: BaseException) -> ExecutorError:  # noqa: PLR0911 - one branch per exception kind
    """Translate a docker-py or requests exception into this library's error tree (most specific first)."""
    if isinstance(exc, ExecutorError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return BackendUnavailableError(
            f"sandbox image not found ({_explanation(exc)}); build it with `adk-sandbox images build`"
        )
    if isinstance(exc, docker.errors.NotFound):
        return SandboxFailedError(f"the sandbox container is gone: {_explanation(exc)}")
    if isinstance(exc, docker.errors.APIError):
        return SandboxFailedError(f"the Docker daemon refused a request: {_explanation(exc)}")
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return BackendUnavailableError(f"the Docker daemon is not reachable ({exc}); {HOW_TO_START_DOCKER}")
    if isinstance(exc, requests.exceptions.Timeout | TimeoutError):
        return SandboxFailedError(f"the Docker daemon did not answer in time: {exc}")
    if isinstance(exc, docker.errors.DockerException):
        text = str(exc)
        if "Error while fetching server API version" in text or "Connection" in text:
            return BackendUnavailableError(
                f"the Docker daemon is not reachable ({text}); {HOW_TO_START_DOCKER}"
            )
        return SandboxFailedError(f"Docker client error: {text}")
    if isinstance(exc, requests.exceptions.RequestException):
        return SandboxFailedError(f"the Docker daemon connection failed: {exc}")
    raise TypeError(f"not a daemon error: {exc!r}")  # pragma: no cover - programming error


@contextlib.contextmanager
def daemon_errors() -> Iterator[None]:
    """Re-raise docker-py and requests exceptions as :mod:`executor.errors` exceptions."""
    try:
        yield
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise map_docker_error(exc) from exc
    except (ConnectionError, FileNotFoundError) as exc:  # the socket itself: refused or missing
        raise map_docker_error(exc) from exc


def _is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: the daemon was briefly unreachable or answered with a server error."""
    if isinstance(exc, docker.errors.APIError):
        return exc.status_code is not None and exc.status_code >= 500 and "is not running" not in str(exc)
    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def idempotent(call: Callable[[], T]) -> T:
    """Run a daemon call that is safe to repeat, retrying transient failures for a bounded time."""
    retrying = retry(
        retry=retry_if_exception(_is_transient),
        stop=stop_after_delay(RETRY_BUDGET_SECONDS),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    )
    with daemon_errors():
        return retrying(call)()


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Remove a container (killing it first); one that is already gone or being removed counts as done."""

    def remove() -> None:
        try:
            client.api.remove_container(container_id, force=True)
        except docker.errors.APIError as exc:
            # 404: already gone (auto_remove won the race); 409: "removal ... already in progress".
            if exc.status_code not in (404, 409):
                raise

    idempotent(remove)


def connect(timeout: float = 60.0) -> docker.DockerClient:
    """A client for the local daemon, after a successful ping; :class:`BackendUnavailableError` if none."""
    socket_path = daemon_socket_path()
    if not os.path.exists(socket_path):
        raise BackendUnavailableError(f"no Docker daemon socket at {socket_path}; {HOW_TO_START_DOCKER}")
    with daemon_errors():
        client = docker.DockerClient(base_url=f"unix://{socket_path}", version="auto", timeout=int(timeout))
    # The API client is a requests session: without this it would take proxies (HTTP(S)_PROXY, ALL_PROXY)
    # and CA bundles (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE) from the environment for the daemon's socket.
    client.api.trust_env = False
    idempotent(client.ping)
    return client


def _explanation(exc: docker.errors.DockerException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)
