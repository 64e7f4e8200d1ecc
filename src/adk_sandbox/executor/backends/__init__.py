"""Sandbox backends. Import them from ``adk_sandbox.executor`` (the Docker and WASM ones load lazily).

``make_backend(config)`` makes any of them from one config (:mod:`.factory`); ``BackendConfig`` is the
union of their configs, told apart by ``type``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.factory import BackendConfig, make_backend

__all__ = ["BackendConfig", "make_backend"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from adk_sandbox.executor.backends import factory  # noqa: PLC0415 - lazy on purpose

        return getattr(factory, name)
    raise AttributeError(f"module 'adk_sandbox.executor.backends' has no attribute {name!r}")
