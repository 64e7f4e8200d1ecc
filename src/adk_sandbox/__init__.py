"""adk-sandbox: the sandbox that coding agents run in.

One import root for the whole library: the public names of :mod:`adk_sandbox.executor` (backends,
requests, results, the Rust pipeline) and :mod:`adk_sandbox.devtools` (the workspace and its six tools),
loaded on first use so ``import adk_sandbox`` stays cheap. Start at README.md; why the root is
``adk_sandbox``: docs/DESIGN.md, "Layout".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adk_sandbox._lazy import lazy_names

if TYPE_CHECKING:
    from adk_sandbox.devtools import (
        DEFAULT_ENV_ALLOWLIST,
        DevToolset,
        FilePermissionError,
        InvalidArgumentsError,
        PathEscapeError,
        ProgressCallback,
        Tool,
        ToolError,
        Workspace,
    )
    from adk_sandbox.executor import (
        DEFAULT_MAX_OUTPUT_BYTES,
        AllowedPath,
        BackendUnavailableError,
        Capabilities,
        CodeTool,
        DockerBackend,
        DockerSession,
        ExecRequest,
        ExecResult,
        ExecutorError,
        InvalidRequestError,
        IsolationClass,
        KubernetesBackend,
        KubernetesConfig,
        Language,
        PolicyNotEnforceableError,
        ProcessBackend,
        ResourceLimits,
        RustExecutor,
        RustExecutorConfig,
        RustResult,
        SandboxBackend,
        SandboxFailedError,
        SandboxPolicy,
        SandboxPolicyBuilder,
        SandboxTool,
        SessionFactory,
        Stream,
        WasmBackend,
        __version__,
    )
    from adk_sandbox.executor.backends.docker import (
        DockerConfig,
        PoolConfig,
        SandboxFiles,
        cleanup_session,
    )
    from adk_sandbox.executor.backends.factory import BackendConfig, make_backend

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "AllowedPath",
    "BackendConfig",
    "BackendUnavailableError",
    "Capabilities",
    "CodeTool",
    "DevToolset",
    "DockerBackend",
    "DockerConfig",
    "DockerSession",
    "ExecRequest",
    "ExecResult",
    "ExecutorError",
    "FilePermissionError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "IsolationClass",
    "KubernetesBackend",
    "KubernetesConfig",
    "Language",
    "PathEscapeError",
    "PolicyNotEnforceableError",
    "PoolConfig",
    "ProcessBackend",
    "ProgressCallback",
    "ResourceLimits",
    "RustExecutor",
    "RustExecutorConfig",
    "RustResult",
    "SandboxBackend",
    "SandboxFailedError",
    "SandboxFiles",
    "SandboxPolicy",
    "SandboxPolicyBuilder",
    "SandboxTool",
    "SessionFactory",
    "Stream",
    "Tool",
    "ToolError",
    "WasmBackend",
    "Workspace",
    "__version__",
    "cleanup_session",
    "make_backend",
]

# Where each public name lives; the module is imported the first time the name is asked for.
_ELSEWHERE = {
    "adk_sandbox.devtools": [
        "DEFAULT_ENV_ALLOWLIST",
        "DevToolset",
        "FilePermissionError",
        "InvalidArgumentsError",
        "PathEscapeError",
        "ProgressCallback",
        "Tool",
        "ToolError",
        "Workspace",
    ],
    "adk_sandbox.executor.backends.docker": ["DockerConfig", "PoolConfig", "SandboxFiles", "cleanup_session"],
    "adk_sandbox.executor.backends.factory": ["BackendConfig", "make_backend"],
}
__getattr__, __dir__ = lazy_names(
    __name__,
    {
        **_ELSEWHERE,
        "adk_sandbox.executor": sorted(set(__all__).difference(*_ELSEWHERE.values())),
    },
)
