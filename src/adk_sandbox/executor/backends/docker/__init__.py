"""The Docker backend: hardened per-session containers (docs/DOCKER.md).

Its names load on first use, so that :class:`DockerConfig` (and the backend config union) is read without
docker-py; the backend, its sessions and the engine functions import it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker._daemon import connect
    from adk_sandbox.executor.backends.docker._dialect import dialect_of
    from adk_sandbox.executor.backends.docker._reaper import cleanup_labelled, cleanup_session, reap_leaked
    from adk_sandbox.executor.backends.docker._snapshot import reap_snapshots, remove_snapshot_image
    from adk_sandbox.executor.backends.docker.backend import DockerBackend
    from adk_sandbox.executor.backends.docker.config import DockerConfig
    from adk_sandbox.executor.backends.docker.engine import Engine, resolve_engine
    from adk_sandbox.executor.backends.docker.images import BASE_IMAGE, RUST_IMAGE
    from adk_sandbox.executor.backends.docker.pool import PoolConfig, PoolStats, SessionPool
    from adk_sandbox.executor.backends.docker.session import DockerSession
    from adk_sandbox.executor.channel.files import DirEntry, FileStat, SandboxFiles

_HERE = "adk_sandbox.executor.backends.docker"
_HOME: dict[str, str] = {
    "connect": f"{_HERE}._daemon",
    "dialect_of": f"{_HERE}._dialect",
    **dict.fromkeys(["cleanup_labelled", "cleanup_session", "reap_leaked"], f"{_HERE}._reaper"),
    **dict.fromkeys(["reap_snapshots", "remove_snapshot_image"], f"{_HERE}._snapshot"),
    "DockerBackend": f"{_HERE}.backend",
    "DockerConfig": f"{_HERE}.config",
    **dict.fromkeys(["Engine", "resolve_engine"], f"{_HERE}.engine"),
    **dict.fromkeys(["BASE_IMAGE", "RUST_IMAGE"], f"{_HERE}.images"),
    **dict.fromkeys(["PoolConfig", "PoolStats", "SessionPool"], f"{_HERE}.pool"),
    "DockerSession": f"{_HERE}.session",
    **dict.fromkeys(["DirEntry", "FileStat", "SandboxFiles"], "adk_sandbox.executor.channel.files"),
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "BASE_IMAGE",
    "RUST_IMAGE",
    "DirEntry",
    "DockerBackend",
    "DockerConfig",
    "DockerSession",
    "Engine",
    "FileStat",
    "PoolConfig",
    "PoolStats",
    "SandboxFiles",
    "SessionPool",
    "cleanup_labelled",
    "cleanup_session",
    "connect",
    "dialect_of",
    "reap_leaked",
    "reap_snapshots",
    "remove_snapshot_image",
    "resolve_engine",
]
