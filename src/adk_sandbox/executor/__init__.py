r"""adk-sandbox executor: run agent code in sandboxes that report the isolation they really enforce.

>>> from executor import ExecRequest, Language, ProcessBackend
>>> with ProcessBackend() as backend:
...     result = backend.execute(ExecRequest(language=Language.COMMAND, code="echo hi", timeout=10))
>>> result.stdout
'hi\\n'
"""

from typing import TYPE_CHECKING

from adk_sandbox._lazy import lazy_names
from adk_sandbox.executor.backend import OutputCallback, SandboxBackend, SessionFactory
from adk_sandbox.executor.backends.bwrap import BubblewrapEnforcer, bwrap_arguments, get_enforcer
from adk_sandbox.executor.backends.enforcer import Confinement, Enforcer
from adk_sandbox.executor.backends.process import ProcessBackend
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    EnforcerUnavailableError,
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.network import NetworkPolicy
from adk_sandbox.executor.policy import AllowedPath, SandboxPolicy, SandboxPolicyBuilder
from adk_sandbox.executor.rust import RustExecutor, RustExecutorConfig, RustResult
from adk_sandbox.executor.tools import CodeTool, SandboxTool
from adk_sandbox.executor.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MAX_BACKGROUND_GROUPS,
    Capabilities,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    ResourceLimits,
    Stream,
)

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
    from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig
    from adk_sandbox.executor.backends.wasm import WasmBackend

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MAX_BACKGROUND_GROUPS",
    "AllowedPath",
    "BackendUnavailableError",
    "BubblewrapEnforcer",
    "Capabilities",
    "CodeTool",
    "Confinement",
    "DockerBackend",
    "DockerSession",
    "Enforcer",
    "EnforcerUnavailableError",
    "ExecRequest",
    "ExecResult",
    "ExecutorError",
    "InvalidRequestError",
    "IsolationClass",
    "KubernetesBackend",
    "KubernetesConfig",
    "Language",
    "NetworkPolicy",
    "OutputCallback",
    "PolicyNotEnforceableError",
    "ProcessBackend",
    "ResourceLimits",
    "RustExecutor",
    "RustExecutorConfig",
    "RustResult",
    "SandboxBackend",
    "SandboxFailedError",
    "SandboxPolicy",
    "SandboxPolicyBuilder",
    "SandboxTool",
    "SessionFactory",
    "Stream",
    "WasmBackend",
    "__version__",
    "bwrap_arguments",
    "get_enforcer",
]

# The engines' backends are imported the first time one is named, so that importing this package (and the
# workspace and tools on top of it) loads no engine's client: docker-py (with paramiko), wasmtime, kubernetes.
__getattr__, _ = lazy_names(
    __name__,
    {
        "adk_sandbox.executor.backends.docker": ["DockerBackend", "DockerSession"],
        "adk_sandbox.executor.backends.kubernetes": ["KubernetesBackend", "KubernetesConfig"],
        "adk_sandbox.executor.backends.wasm": ["WasmBackend"],
    },
)
