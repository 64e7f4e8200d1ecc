"""The exceptions raised by :mod:`adk_sandbox.executor`.

Every failure of the library is an :class:`ExecutorError`. A command that runs and fails (non-zero exit,
a signal, a timeout, an OOM kill) is **not** an error: it is an
:class:`~adk_sandbox.executor.types.ExecResult`. Exceptions are for requests that must not run and for
infrastructure that cannot run them::

    ExecutorError
    ├── InvalidRequestError          the request itself is wrong (bad language, timeout, env); nothing ran
    │                                (also a ValueError)
    ├── BackendUnavailableError      the backend cannot run anything here (no Docker daemon, no program
    │                                for the language); the message says how to fix it
    │   └── EnforcerUnavailableError the OS sandbox enforcer (bubblewrap) is missing or does not work
    ├── PolicyNotEnforceableError    asked for isolation the backend cannot give; refused, nothing ran
    └── SandboxFailedError           the sandbox broke while running (the enforcer or container failed,
                                     not the user's command)

Exceptions of wrapped libraries (docker-py, requests) are translated into this tree in one place, the
backend that wraps them, so callers never need to import a third-party exception type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "BackendUnavailableError",
    "EnforcerUnavailableError",
    "ExecutorError",
    "InvalidRequestError",
    "PolicyNotEnforceableError",
    "SandboxFailedError",
]


class ExecutorError(Exception):
    """Base class of every exception raised by :mod:`adk_sandbox.executor`."""


class InvalidRequestError(ExecutorError, ValueError):
    """The request is invalid for this backend; nothing was run."""


class BackendUnavailableError(ExecutorError):
    """The backend cannot run anything on this machine; the message says how to make it available."""


class EnforcerUnavailableError(BackendUnavailableError):
    """The OS-level sandbox enforcer is missing or unusable; the message names the package to install."""


class PolicyNotEnforceableError(ExecutorError):
    """The requested isolation cannot be enforced by this backend, so it refuses to run (fail closed)."""


class SandboxFailedError(ExecutorError):
    """The sandbox itself failed while running a request (not the user's program)."""


def validation_problems(exc: ValidationError, whole: str = "") -> str:
    """What pydantic found wrong, one ``field: message`` each (``whole`` names a problem of no field).

    For an :class:`InvalidRequestError`'s message, which a model reads: the fields as the caller named
    them, without pydantic's links.
    """
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or whole}: {e['msg']}" for e in exc.errors())
