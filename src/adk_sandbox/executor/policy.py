"""SandboxPolicy: what a sandboxed execution may touch. Deny-all by default."""

from __future__ import annotations

import os
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adk_sandbox.executor.types import validate_env

__all__ = ["AllowedPath", "SandboxPolicy", "SandboxPolicyBuilder"]


class AllowedPath(BaseModel):
    """A host path made visible inside the sandbox, at the same absolute path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """Absolute host path (file or directory)."""
    mode: Literal["read_only", "read_write"] = "read_only"
    """Whether the sandbox may write under it."""

    @field_validator("path")
    @classmethod
    def _absolute_and_normal(cls, path: str) -> str:
        if "\0" in path:
            raise ValueError("allowed path contains a NUL byte")
        if not os.path.isabs(path):
            raise ValueError(f"allowed path {path!r} must be absolute")
        # Normalised lexically so the same directory is not bound twice under two spellings; symlinks are
        # left to the enforcer, which binds what the path resolves to at run time.
        return os.path.normpath(path)


class SandboxPolicy(BaseModel):
    """What a sandboxed program may do. The default denies everything.

    Only an enforcing backend (``ProcessBackend.with_sandbox``, Docker) applies the restrictions; a backend
    that cannot enforce a restriction the policy asks for raises ``PolicyNotEnforceableError`` instead of
    running with less isolation than asked.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_paths: tuple[AllowedPath, ...] = ()
    """Host paths visible inside the sandbox; nothing else of the host's own data is."""
    allow_network: bool = False
    """Allow network access (by default the sandbox has only its own loopback)."""
    allow_process_spawn: bool = False
    """Allow the program to start further processes (a shell command always does)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the cleared environment (a request's own ``env`` overrides them)."""

    @field_validator("env")
    @classmethod
    def _env_is_passable(cls, env: dict[str, str]) -> dict[str, str]:
        return validate_env(env)

    @classmethod
    def builder(cls) -> SandboxPolicyBuilder:
        """Start building a policy from deny-all."""
        return SandboxPolicyBuilder()

    @property
    def read_only_paths(self) -> tuple[str, ...]:
        """Paths allowed read-only."""
        return tuple(p.path for p in self.allowed_paths if p.mode == "read_only")

    @property
    def read_write_paths(self) -> tuple[str, ...]:
        """Paths allowed read-write."""
        return tuple(p.path for p in self.allowed_paths if p.mode == "read_write")

    def covers(self, path: str | os.PathLike[str]) -> bool:
        """True if ``path`` is an allowed path or lies under one (lexically, after normalisation)."""
        target = os.path.normpath(os.path.abspath(path))
        return any(
            target == allowed.path or target.startswith(allowed.path.rstrip("/") + "/")
            for allowed in self.allowed_paths
        )


class SandboxPolicyBuilder:
    """Fluent builder: ``SandboxPolicy.builder().allow_read(p).allow_network().build()``."""

    def __init__(self) -> None:
        self._paths: list[AllowedPath] = []
        self._network = False
        self._spawn = False
        self._env: dict[str, str] = {}

    def allow_read(self, path: str | os.PathLike[str]) -> Self:
        """Make ``path`` readable inside the sandbox."""
        self._paths.append(AllowedPath(path=os.fspath(path), mode="read_only"))
        return self

    def allow_read_write(self, path: str | os.PathLike[str]) -> Self:
        """Make ``path`` readable and writable inside the sandbox."""
        self._paths.append(AllowedPath(path=os.fspath(path), mode="read_write"))
        return self

    def allow_network(self) -> Self:
        """Allow network access."""
        self._network = True
        return self

    def allow_process_spawn(self) -> Self:
        """Allow the program to start further processes."""
        self._spawn = True
        return self

    def env(self, key: str, value: str) -> Self:
        """Set an environment variable for every execution."""
        self._env[key] = value
        return self

    def build(self) -> SandboxPolicy:
        """Return the immutable policy."""
        return SandboxPolicy(
            allowed_paths=tuple(self._paths),
            allow_network=self._network,
            allow_process_spawn=self._spawn,
            env=dict(self._env),
        )
