"""The task profile's cap on root-filesystem writes: how an engine enforces it, or a watch that does.

:func:`root_cap_for` picks ``memory`` (gVisor's memory overlay), ``quota`` (XFS project quota, probed by
:func:`size_refusal`) or ``watched`` (:class:`RootWatcher` kills the container past the cap); a runsc
without the memory overlay is refused. Depth: docs/docker/profiles.md, "How the root's writes are capped".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import docker
import docker.errors

from adk_sandbox.executor._owner import owner_labels
from adk_sandbox.executor.backends.docker._spec import GVISOR_RUNTIME
from adk_sandbox.executor.errors import PolicyNotEnforceableError
from adk_sandbox.executor.types import ResourceLimits

__all__ = ["MEMORY_OVERLAY", "WATCH_SECONDS", "RootWatcher", "root_cap_for", "size_refusal"]

log = logging.getLogger(__name__)

#: The runsc flag that holds root-filesystem writes in the sandbox's memory (scripts/setup registers it).
MEMORY_OVERLAY = "--overlay2=root:memory"
#: How often a watched layer's size is read.
WATCH_SECONDS = 0.5


def root_cap_for(
    info: Mapping[str, Any],
    runtime: str | None,
    limits: ResourceLimits,
    root_size_mb: int,
    *,
    explicit: bool,
    size_refused: Callable[[int], str | None],
) -> tuple[str, int]:
    """How this engine (``docker info``) caps a task container's root writes, and the cap in MiB.

    ``explicit``: the user gave ``root_size_mb`` (under gVisor the cap is the memory limit, so a smaller
    one cannot be kept and is refused). ``size_refused(mb)`` asks the engine whether it takes
    ``--storage-opt size=<mb>M`` (None: it does; else why not, e.g. :func:`size_refusal`); called only for
    overlay2 on XFS, where a quota may hold.
    """
    if runtime == GVISOR_RUNTIME:
        registered = (info.get("Runtimes") or {}).get(GVISOR_RUNTIME) or {}
        arguments = registered.get("runtimeArgs") or registered.get("RuntimeArgs") or []
        if MEMORY_OVERLAY not in arguments:
            raise PolicyNotEnforceableError(
                f"profile='task' under gVisor needs runsc registered with {MEMORY_OVERLAY} (this engine's "
                f"runsc has {arguments or 'no arguments'}): without it root-filesystem writes go to an "
                "uncapped file on the host's disk. Add it to the runtime's runtimeArgs in "
                "/etc/docker/daemon.json and reload dockerd (scripts/setup does this)"
            )
        if explicit and root_size_mb < limits.memory_mb:
            raise PolicyNotEnforceableError(
                f"under gVisor a task container's root writes are held in memory and capped by its memory "
                f"limit ({limits.memory_mb} MiB), not by root_size_mb={root_size_mb}; give "
                f"ResourceLimits(memory_mb={root_size_mb}) to cap them lower, or leave root_size_mb out"
            )
        return "memory", limits.memory_mb
    status = dict((str(key), str(value)) for key, value in info.get("DriverStatus") or [])
    if info.get("Driver") == "overlay2" and status.get("Backing Filesystem") == "xfs":
        refused = size_refused(root_size_mb)
        if refused is None:
            return "quota", root_size_mb
        # Still capped, by the watch: an XFS data root without project quotas (mounted without pquota).
        log.warning("the task profile's root cap is watched, not a quota: the engine refused "
                    "--storage-opt size (%s)", refused)  # fmt: skip
    return "watched", root_size_mb


def size_refusal(client: docker.DockerClient, image: str, size_mb: int) -> str | None:
    """None when the engine creates a container with ``--storage-opt size=<size_mb>M``; else why not.

    ``docker info`` shows an XFS data root mounted without ``pquota`` as it shows one with it; only a create
    with the option tells them apart (overlay2 refuses it: "--storage-opt is supported only for overlay
    over xfs with 'pquota' mount option"). So one container is created from ``image`` (or, missing, any
    image the engine has), never started, and removed (10-50 ms here). It carries the project's owner
    labels, so a reaper removes it if this process dies in between.
    """
    labels = owner_labels(f"rootcap-probe-{uuid.uuid4().hex[:12]}", 300)
    host_config = client.api.create_host_config(network_mode="none", storage_opt={"size": f"{size_mb}M"})
    candidates = [image]
    with contextlib.suppress(docker.errors.DockerException, OSError):
        candidates += [str(found) for found in client.api.images(quiet=True)][:1]
    for candidate in candidates:
        try:
            created = client.api.create_container(
                candidate, ["true"], labels=labels, host_config=host_config, network_disabled=True
            )
        except docker.errors.ImageNotFound:
            continue
        except docker.errors.APIError as exc:
            return str(exc.explanation or exc)
        with contextlib.suppress(docker.errors.DockerException, OSError):
            client.api.remove_container(created["Id"], force=True)
        return None
    return f"no image on the engine to try it with ({image} is missing)"


class RootWatcher:
    """Reads a container's writable-layer size every :data:`WATCH_SECONDS`; kills it past the cap.

    ``on_over`` is called once, with the reason, before the kill (the session refuses further calls).
    """

    def __init__(
        self, client: docker.DockerClient, container_id: str, cap_mb: int, on_over: Callable[[str], None]
    ) -> None:
        self._client = client
        self._id = container_id
        self._cap = cap_mb * 1024 * 1024
        self._cap_mb = cap_mb
        self._on_over = on_over
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name=f"adk-sandbox-root-{container_id[:12]}", daemon=True
        )
        self._thread.start()

    def size(self) -> int | None:
        """The writable layer's size in bytes as the engine counts it (None: the container is gone)."""
        try:
            found = self._client.api.containers(all=True, size=True, filters={"id": self._id})
        except (docker.errors.DockerException, OSError):  # requests' errors are OSErrors
            return None
        return int(found[0].get("SizeRw") or 0) if found else None

    def check(self) -> bool:
        """Read the size once; past the cap: report and kill. True when it was past the cap."""
        size = self.size()
        if size is None or size <= self._cap:
            return False
        self._stop.set()
        reason = (
            f"the session was stopped: its root filesystem's writes reached {size // (1024 * 1024)} MiB, "
            f"past the cap of {self._cap_mb} MiB (root_size_mb). Everything the session wrote is discarded; "
            "open a new session, and give a larger root_size_mb if the task needs it"
        )
        log.warning("sandbox container %s: %s", self._id[:12], reason)
        self._on_over(reason)
        # Gone already: the session refuses further calls either way.
        with contextlib.suppress(docker.errors.DockerException, OSError):
            self._client.api.kill(self._id)
        return True

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            self.check()

    def stop(self) -> None:
        """Stop watching (the container is being removed)."""
        self._stop.set()
