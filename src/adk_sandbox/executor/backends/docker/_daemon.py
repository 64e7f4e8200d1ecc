"""The one place that talks to the Docker daemon's client library: connecting, retrying, mapping errors.

Every docker-py call of the backend goes through :func:`daemon_errors`, so a caller only ever sees this
library's exceptions (:mod:`adk_sandbox.executor.errors`), and through :func:`idempotent` when repeating it is
safe (ping, create with a fixed name, inspect, remove). User commands are never retried: a command that may
have started is never started again.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import docker
import docker.errors
import requests
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from adk_sandbox.executor.backends.docker.engine import Engine, resolve_engine
from adk_sandbox.executor.errors import BackendUnavailableError, ExecutorError, SandboxFailedError

__all__ = [
    "DEFAULT_SOCKET",
    "HOW_TO_START_DOCKER",
    "connect",
    "daemon_errors",
    "daemon_socket_path",
    "engine_of",
    "idempotent",
    "map_docker_error",
    "remove_container",
]

DEFAULT_SOCKET = "/var/run/docker.sock"

HOW_TO_START_DOCKER = (
    "start the Docker engine: `sudo systemctl start docker`, or `sudo dockerd &` where there is no "
    "systemd, or run this project's `scripts/setup` (it installs and starts one on Debian as root)"
)

#: The API version a client is made with before the engine's own is asked (docker-py's minimum).
_MIN_API = "1.24"

#: Longest time an idempotent daemon call is retried before its error is raised.
RETRY_BUDGET_SECONDS = 10.0

T = TypeVar("T")


def daemon_socket_path() -> str:
    """The Unix socket of the environment's engine (``DOCKER_HOST=unix://...`` or the default).

    For code that needs a local engine's socket; a TCP or SSH engine is refused with a clear error (a
    backend takes any engine: see :mod:`.engine`).
    """
    engine = resolve_engine()
    if engine.socket_path is None:
        raise BackendUnavailableError(
            f"the Docker engine {engine.describe()} is not a local Unix socket; this needs one (unset "
            "DOCKER_HOST or point it at unix:///var/run/docker.sock)"
        )
    return engine.socket_path


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
    """Re-raise docker-py and requests exceptions as :mod:`adk_sandbox.executor.errors` exceptions."""
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


#: How long :func:`remove_container` waits for a removal the engine already started (auto_remove) to end.
REMOVAL_WAIT_SECONDS = 30.0


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Remove a container (killing it first); returns once it is gone.

    One already gone counts as done. One whose removal the engine already started (``auto_remove`` after
    the container was killed, say by the root-size watcher: a 409 "removal ... already in progress") is
    waited for, up to :data:`REMOVAL_WAIT_SECONDS`, so that a closed session's container is not still
    listed a moment later.
    """

    def remove() -> bool:
        for attempt in range(_FROZEN_ATTEMPTS):
            try:
                client.api.remove_container(container_id, force=True, v=True)  # v: its mirror volume too
            except docker.errors.APIError as exc:
                # 404: already gone (auto_remove won the race); 409: "removal ... already in progress".
                if exc.status_code == 409:
                    return False
                if exc.status_code == 404:
                    return True
                if attempt == _FROZEN_ATTEMPTS - 1:
                    raise
                # A paused session's container whose owner died: a frozen gVisor sandbox may refuse the
                # kill ("PID ... is zombie and can not be killed") until it is unpaused.
                _unpause(client, container_id)
                time.sleep(0.2)
            else:
                return True
        return True

    if idempotent(remove):
        return
    deadline = time.monotonic() + REMOVAL_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            with daemon_errors():
                client.api.inspect_container(container_id)
        except ExecutorError:
            return  # gone (404), or the engine stopped answering: nothing more to wait for here
        time.sleep(0.05)


def _unpause(client: docker.DockerClient, container_id: str) -> None:
    """Unpause the container, whatever its state (an error says it was not paused, or is gone)."""
    with contextlib.suppress(docker.errors.DockerException, OSError):
        client.api.unpause(container_id)


#: How often :func:`remove_container` tries a container that refuses to be killed (unpausing it between).
_FROZEN_ATTEMPTS = 10


#: The engine each client made by :func:`connect` talks to (the transports dial the same one).
_engines: weakref.WeakKeyDictionary[docker.DockerClient, Engine] = weakref.WeakKeyDictionary()


def engine_of(client: docker.DockerClient) -> Engine:
    """The engine ``client`` was connected to by :func:`connect` (the environment's for any other client)."""
    engine = _engines.get(client)
    return engine if engine is not None else resolve_engine()


def connect(timeout: float = 60.0, engine: Engine | str | None = None) -> docker.DockerClient:
    """A client of ``engine`` (default: the environment's), after a successful ping.

    :class:`BackendUnavailableError` when it does not answer.
    """
    chosen = resolve_engine(engine)
    socket_path = chosen.socket_path
    if socket_path is not None and not os.path.exists(socket_path):
        raise BackendUnavailableError(f"no Docker daemon socket at {socket_path}; {HOW_TO_START_DOCKER}")
    with daemon_errors():
        # A fixed version first: "auto" would ask the engine inside the constructor, before trust_env can
        # be switched off below. The real version is negotiated right after.
        client = docker.DockerClient(**chosen.client_arguments(), version=_MIN_API, timeout=int(timeout))
    # The API client is a requests session: without this it would take proxies (HTTP(S)_PROXY, ALL_PROXY)
    # and CA bundles (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE) from the environment for the daemon's socket; a
    # CA bundle there would replace the engine's own CA for a TLS engine (CERTIFICATE_VERIFY_FAILED).
    client.api.trust_env = False
    try:
        api: Any = client.api
        api._version = idempotent(api._retrieve_server_version)  # what version="auto" does
        idempotent(client.ping)
    except BackendUnavailableError as exc:
        client.close()
        if chosen.local:
            raise
        raise BackendUnavailableError(
            f"the Docker engine at {chosen.describe()} is not reachable ({exc}); check that it runs and that "
            "DOCKER_HOST / the Docker context name it"
        ) from exc
    except BaseException:
        client.close()
        raise
    _engines[client] = chosen
    return client


def _explanation(exc: docker.errors.DockerException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)
