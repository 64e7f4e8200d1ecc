"""One config union and one factory: any backend from a mapping or a typed config chosen by ``type``.

:data:`BackendConfig`, :func:`parse_config` and :func:`make_backend`, which imports an engine's module
only when its backend is made. Depth: docs/GUIDE.md, "Choosing a backend".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from adk_sandbox.executor.backend import SandboxBackend
from adk_sandbox.executor.backends.bwrap import BwrapConfig, get_enforcer
from adk_sandbox.executor.backends.docker.config import DockerConfig
from adk_sandbox.executor.backends.kubernetes.config import KubernetesConfig
from adk_sandbox.executor.backends.microvm.config import MicroVMConfig
from adk_sandbox.executor.backends.process import ProcessBackend, ProcessConfig
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.network.policy import network_setting

__all__ = ["BACKEND_TYPES", "BackendConfig", "WasmConfig", "make_backend", "parse_config"]


class WasmConfig(BaseModel):
    """A :class:`~adk_sandbox.executor.backends.wasm.WasmBackend`'s setting (here: wasm.py needs wasmtime)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["wasm"] = "wasm"
    memory_limit_mb: Annotated[int, Field(gt=0)] = 256
    """The cap on each module's linear memory."""


BackendConfig = Annotated[
    Union[DockerConfig, KubernetesConfig, MicroVMConfig, ProcessConfig, BwrapConfig, WasmConfig],  # noqa: UP007 - a discriminated union
    Field(discriminator="type"),
]
"""Every backend's config, told apart by its ``type`` field (``docker`` is gVisor too: ``runtime: runsc``)."""

#: The names ``type`` (and the CLI's ``--backend``, the inspect provider's ``backend:``) takes.
BACKEND_TYPES = ("docker", "kubernetes", "microvm", "process", "bwrap", "wasm")

_ADAPTER: TypeAdapter[Any] = TypeAdapter(BackendConfig)


def parse_config(config: BackendConfig | Mapping[str, Any]) -> BackendConfig:
    """``config`` as its typed model; a mapping needs ``type``. Unknown types and keys are refused."""
    if isinstance(config, BaseModel):
        return config  # one of the union's members, checked when it was made
    if not isinstance(config, Mapping):
        raise InvalidRequestError(
            f"a backend config is a mapping or a config model, not {type(config).__name__}"
        )
    kind = config.get("type")
    if kind not in BACKEND_TYPES:
        raise InvalidRequestError(
            f"backend type {kind!r} is not one of {', '.join(BACKEND_TYPES)}"
            if kind is not None
            else f"a backend config needs a 'type': one of {', '.join(BACKEND_TYPES)}"
        )
    try:
        parsed: BackendConfig = _ADAPTER.validate_python(dict(config))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'][1:]) or 'config'}: "
            f"{str(error['msg']).removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise InvalidRequestError(f"{kind} backend config: {problems}") from None
    return parsed


def make_backend(config: BackendConfig | Mapping[str, Any]) -> SandboxBackend:
    """The backend ``config`` describes, its engine's module imported only now.

    A mapping is checked first (:func:`parse_config`); the backend's constructor then connects, probes or
    refuses as it always does (``BackendUnavailableError`` where its engine is missing).
    """
    parsed = parse_config(config)
    if isinstance(parsed, DockerConfig):
        from adk_sandbox.executor.backends.docker import DockerBackend  # noqa: PLC0415 - lazy on purpose

        return DockerBackend(config=parsed)
    if isinstance(parsed, KubernetesConfig):
        from adk_sandbox.executor.backends.kubernetes import KubernetesBackend  # noqa: PLC0415

        return KubernetesBackend(parsed, context=parsed.context)
    if isinstance(parsed, MicroVMConfig):
        from adk_sandbox.executor.backends.microvm import MicroVMBackend  # noqa: PLC0415

        return MicroVMBackend(parsed)
    if isinstance(parsed, WasmConfig):
        from adk_sandbox.executor.backends.wasm import WasmBackend  # noqa: PLC0415 - needs wasmtime

        return WasmBackend(memory_limit_mb=parsed.memory_limit_mb)
    if isinstance(parsed, BwrapConfig):
        return ProcessBackend.with_sandbox(
            get_enforcer(),
            parsed.policy,
            workdir=parsed.workdir,
            search_path=parsed.search_path,
            network=network_setting(parsed.network),
        )
    return parsed.make()
