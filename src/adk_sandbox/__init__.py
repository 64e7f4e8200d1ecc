r"""adk-sandbox: the sandbox that coding agents run in.

One import root for the whole library. The public names a user needs are here, loaded on first use so
``import adk_sandbox`` stays cheap (a host-only user never loads docker-py):

>>> import asyncio, tempfile
>>> from adk_sandbox import DevToolset, Workspace
>>> with Workspace(tempfile.mkdtemp()) as ws:
...     tools = DevToolset(ws)
...     _ = asyncio.run(tools.run("write_file", {"path": "a.txt", "content": "hi\n"}))
...     asyncio.run(tools.run("read_file", {"path": "a.txt"}))["content"]
'     1\thi\n'

The two layers stay importable by their own names: :mod:`adk_sandbox.executor` (backends, requests,
results, the Rust pipeline) and :mod:`adk_sandbox.devtools` (the workspace and its six tools, the
integrations under :mod:`adk_sandbox.devtools.adapters`). The import root is ``adk_sandbox`` so that the
project installs next to other distributions named ``executor`` or ``devtools`` without replacing them.
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
