"""Leak protection: who owns a sandbox container, and removing the ones whose owner is gone.

Each container is labelled with its owner process (pid, the process's start time so a reused pid is not
mistaken for the owner, the machine's boot id, its host name and pid namespace) and an expiry time. A
container is leaked when its expiry has passed, or when it was made on this machine in this boot and its
owner process no longer exists. An engine can be shared by several machines (a remote engine), and
clients in containers share a boot id: a pid means something only on the same host, boot and pid
namespace, so any other owner's containers are judged by their expiry alone. Containers without the
owner labels (for example a compose service) are never touched.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker

from adk_sandbox.executor._owner import (  # the labels are every engine's; re-exported for Docker's modules
    PROJECT_LABEL,
    SESSION,
    leak_reason,
    owner_labels,
)
from adk_sandbox.executor.backends.docker._daemon import connect, idempotent, remove_container
from adk_sandbox.executor.backends.docker._spec import validate_labels
from adk_sandbox.executor.errors import InvalidRequestError

__all__ = [
    "LeakedContainer",
    "cleanup_labelled",
    "cleanup_session",
    "find_leaked",
    "note_unremoved",
    "owner_labels",
    "reap_leaked",
]


#: Ids of this process's containers that their closed sessions could not remove (see the module docstring).
_unremoved: set[str] = set()
_unremoved_lock = threading.Lock()


def note_unremoved(container_id: str) -> None:
    """Record that a closed session could not remove its container: the next reaping removes it."""
    with _unremoved_lock:
        _unremoved.add(container_id)


@dataclass(frozen=True)
class LeakedContainer:
    """A container of this project that nobody owns any more."""

    id: str
    name: str
    reason: str


def find_leaked(client: docker.DockerClient) -> list[LeakedContainer]:
    """Containers of this project (selected by label, never by name) whose owner is gone or expired."""
    listed: list[dict[str, Any]] = idempotent(
        lambda: client.api.containers(all=True, filters={"label": PROJECT_LABEL})
    )
    now = time.time()
    leaked = []
    with _unremoved_lock:
        unremoved = set(_unremoved)
    for entry in listed:
        reason = leak_reason(entry.get("Labels") or {}, now)
        if reason is None and entry["Id"] in unremoved:
            reason = "its session was closed while the Docker engine could not be reached"
        if reason is not None:
            names = entry.get("Names") or [""]
            leaked.append(LeakedContainer(id=entry["Id"], name=names[0].lstrip("/"), reason=reason))
    return leaked


def reap_leaked(client: docker.DockerClient) -> list[LeakedContainer]:
    """Remove leaked containers; return what was removed."""
    removed = []
    for container in find_leaked(client):
        remove_container(client, container.id)
        with _unremoved_lock:
            _unremoved.discard(container.id)
        removed.append(container)
    return removed


_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def cleanup_session(session_id: str, client: docker.DockerClient | None = None) -> list[str]:
    """Remove every container of this project labelled with ``session_id``; return the removed ids.

    For a client that kept a session's id (``DockerSession.session_id``) and must clean up after it from
    another process (inspect_ai's ``cli_cleanup(id)``): selected by the labels ``io.adk-sandbox.project``
    and ``io.adk-sandbox.session``, never by name, whoever owns the container. A container already gone
    is not an error; an id nothing carries removes nothing. ``client`` defaults to a new connection.
    """
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise InvalidRequestError(
            f"session id {session_id!r} is not one this library makes (letters, digits, '_.-', at most 64)"
        )
    if client is None:
        owned = connect()
        try:
            return cleanup_session(session_id, owned)
        finally:
            owned.close()
    listed: list[dict[str, Any]] = idempotent(
        lambda: client.api.containers(all=True, filters={"label": [PROJECT_LABEL, f"{SESSION}={session_id}"]})
    )
    removed = []
    for entry in listed:
        remove_container(client, entry["Id"])
        removed.append(str(entry["Id"]))
    return removed


def cleanup_labelled(
    labels: Mapping[str, str], match: str | None = None, client: docker.DockerClient | None = None
) -> list[str]:
    """Remove this project's containers that carry every one of ``labels``; return the removed ids.

    For a client that labelled its containers (``DockerBackend(labels=...)``) and cleans them up from
    another process (inspect_ai's ``cli_cleanup``): selected by the label ``io.adk-sandbox.project`` and
    ``labels``, whoever owns the container. With ``match``, only the ones among them whose id starts with
    it or whose name is it. ``labels`` are user labels (:func:`~._spec.validate_labels`; at least one).
    A container already gone is not an error. ``client`` defaults to a new connection.
    """
    wanted = validate_labels(labels)
    if not wanted:
        raise InvalidRequestError("cleanup_labelled needs at least one label to select containers by")
    if client is None:
        owned = connect()
        try:
            return cleanup_labelled(wanted, match, owned)
        finally:
            owned.close()
    selector = [PROJECT_LABEL, *(f"{key}={value}" for key, value in wanted.items())]
    listed: list[dict[str, Any]] = idempotent(
        lambda: client.api.containers(all=True, filters={"label": selector})
    )
    removed = []
    for entry in listed:
        names = [name.lstrip("/") for name in entry.get("Names") or []]
        if match is None or entry["Id"].startswith(match) or match in names:
            remove_container(client, entry["Id"])
            removed.append(str(entry["Id"]))
    return removed
