r"""adk-sandbox executor: run agent code in sandboxes that report the isolation they really enforce.

>>> from executor import ExecRequest, Language, ProcessBackend
>>> with ProcessBackend() as backend:
...     result = backend.execute(ExecRequest(language=Language.COMMAND, code="echo hi", timeout=10))
>>> result.stdout
'hi\\n'
"""

from executor.backend import OutputCallback, SandboxBackend
from executor.backends.bwrap import BubblewrapEnforcer, bwrap_arguments, get_enforcer
from executor.backends.enforcer import Confinement, Enforcer
from executor.backends.process import ProcessBackend
from executor.errors import (
    BackendUnavailableError,
    EnforcerUnavailableError,
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from executor.policy import AllowedPath, SandboxPolicy, SandboxPolicyBuilder
from executor.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    Capabilities,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    ResourceLimits,
    Stream,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "AllowedPath",
    "BackendUnavailableError",
    "BubblewrapEnforcer",
    "Capabilities",
    "Confinement",
    "Enforcer",
    "EnforcerUnavailableError",
    "ExecRequest",
    "ExecResult",
    "ExecutorError",
    "InvalidRequestError",
    "IsolationClass",
    "Language",
    "OutputCallback",
    "PolicyNotEnforceableError",
    "ProcessBackend",
    "ResourceLimits",
    "SandboxBackend",
    "SandboxFailedError",
    "SandboxPolicy",
    "SandboxPolicyBuilder",
    "Stream",
    "__version__",
    "bwrap_arguments",
    "get_enforcer",
]
