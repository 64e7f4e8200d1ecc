"""The agent channel, engine-neutral: how a session runs commands and file operations through an agent.

An engine supplies an :data:`~.streams.AgentStreamOpener` (a byte stream to a new agent in its sandbox);
everything above it is here: :mod:`.transport`, :mod:`.agent_transport` and :mod:`.frames`,
:mod:`.session`, :mod:`.files`, :mod:`.probe`, and the in-sandbox programs under ``inside/``. Nothing here
imports an engine or a backend. Map: docs/DOCKER.md, "Code"; seams: docs/BACKENDS.md.
"""

from adk_sandbox.executor.channel.agent_transport import (
    AGENT_GRACE_SECONDS,
    AgentTransport,
    FileOpCancelledError,
)
from adk_sandbox.executor.channel.files import DirEntry, FileOperator, FileStat, SandboxFiles
from adk_sandbox.executor.channel.probe import WorkspaceNotSharedError, verify_from_inside
from adk_sandbox.executor.channel.streams import AgentStream, AgentStreamOpener, SocketStream
from adk_sandbox.executor.channel.transport import (
    DEFAULT_PATH,
    CommandOutcome,
    CommandTransport,
    ContainerGoneError,
    PreparedCommand,
)

__all__ = [
    "AGENT_GRACE_SECONDS",
    "DEFAULT_PATH",
    "AgentStream",
    "AgentStreamOpener",
    "AgentTransport",
    "CommandOutcome",
    "CommandTransport",
    "ContainerGoneError",
    "DirEntry",
    "FileOpCancelledError",
    "FileOperator",
    "FileStat",
    "PreparedCommand",
    "SandboxFiles",
    "SocketStream",
    "WorkspaceNotSharedError",
    "verify_from_inside",
]
