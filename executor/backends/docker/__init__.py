"""The Docker backend: hardened per-session containers (docs/DOCKER.md)."""

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
