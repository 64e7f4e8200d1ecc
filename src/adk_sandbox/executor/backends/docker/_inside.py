"""Commands a snapshot runs in a Docker session's sandbox outside any request, and its private files.

Shared by the snapshot's parts (:mod:`._snapshot`: the tmpfs archives; :mod:`._root_archive`: the task
profile's root under gVisor): each reads or writes bytes through the session's own channel, never
unpacked on the host, and keeps them in files only this user can read.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING

from adk_sandbox.executor._output import OutputCapture
from adk_sandbox.executor.channel.transport import PreparedCommand
from adk_sandbox.executor.errors import SandboxFailedError
from adk_sandbox.executor.types import Stream

if TYPE_CHECKING:
    from adk_sandbox.executor.backends.docker._container import OpenedContainer
    from adk_sandbox.executor.backends.docker.session import DockerSession

__all__ = ["ARCHIVE_SECONDS", "run_in_sandbox", "write_private"]

#: How long one archive step (a directory out or in) may take.
ARCHIVE_SECONDS = 300.0


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to a new file at ``path``, mode 0600 (refused if anything is there, a link included)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _sandbox_user(session: DockerSession) -> str:
    """Who archives and restores the tmpfs directories: the task profile's root, else the command user."""
    return "0:0" if session._config.spec.task else session._user


def run_in_sandbox(
    session: DockerSession,
    container: OpenedContainer,
    argv: tuple[str, ...],
    stdin: bytes | None,
    max_output: int,
) -> tuple[int | None, bytes, bytes, bool]:
    """Run ``argv`` in the session's sandbox outside any request: exit code, stdout, stderr, truncated."""
    transport = session._transport
    if transport is None:
        raise SandboxFailedError("the sandbox container is gone; nothing was taken")
    command = PreparedCommand(
        argv=argv, env=dict(container.base_env), user=_sandbox_user(session), workdir="/", stdin=stdin,
        marker=uuid.uuid4().hex,
    )  # fmt: skip
    capture = _BinaryCapture(max_output)
    outcome = transport.run(command, capture, deadline=time.monotonic() + ARCHIVE_SECONDS, cancel=None)
    streams = capture.finish()
    return outcome.exit_code, streams["stdout"].data, streams["stderr"].data, streams["stdout"].truncated


class _BinaryCapture(OutputCapture):
    """An output capture that keeps bytes only, up to its cap: a tar is not text.

    The command capture decodes every chunk as UTF-8 for its line callback: 0.5 s of a 50 MB archive's
    0.65 s here. The cut at the cap is a byte count (the caller refuses a truncated archive anyway).
    """

    def feed(self, stream: Stream, chunk: bytes) -> None:
        """Keep ``chunk`` up to the cap; count what is dropped."""
        with self._lock:
            state = self._streams[stream]
            state.total += len(chunk)
            room = self.max_bytes - len(state.kept)
            if room > 0:
                state.kept += chunk[:room]
            else:
                state.full = True
