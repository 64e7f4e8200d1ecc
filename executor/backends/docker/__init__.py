"""The Docker backend: hardened per-session containers (SPEC §4)."""

from executor.backends.docker._reaper import cleanup_labelled, cleanup_session
from executor.backends.docker.backend import DockerBackend
from executor.backends.docker.config import DockerConfig
from executor.backends.docker.engine import Engine, resolve_engine
from executor.backends.docker.files import DirEntry, FileStat, SandboxFiles
from executor.backends.docker.images import BASE_IMAGE, RUST_IMAGE
from executor.backends.docker.pool import PoolConfig, PoolStats, SessionPool
from executor.backends.docker.session import DockerSession

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
    "resolve_engine",
]
