"""QEMU's machine protocol (QMP) on a VM's monitor socket: stop, go on, migrate its state to a file.

The socket is in the VM's run directory (mode 0700, this process's); the guest has no way to it. One client
at a time (QEMU's chardev accepts one): the session keeps one open while the VM runs.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from adk_sandbox.executor.errors import SandboxFailedError

__all__ = ["Qmp"]

#: The most bytes of one QMP message read before it is given up as not QEMU's.
_MAX_LINE = 1 << 20


class Qmp:
    """A QMP connection to one QEMU (see the module docstring)."""

    def __init__(self, path: Path, until: float) -> None:
        """Connect to ``path`` (waiting for QEMU to listen, until ``until``) and leave the greeting mode."""
        while True:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._sock.connect(str(path))
                break
            except OSError as exc:
                self._sock.close()
                if time.monotonic() >= until:
                    raise SandboxFailedError(f"the microVM's monitor did not answer ({exc})") from exc
                time.sleep(0.01)
        self._sock.settimeout(max(until - time.monotonic(), 1.0))
        self._file = self._sock.makefile("rb")
        self._read()  # {"QMP": {...}}: the greeting
        self.command("qmp_capabilities")

    def command(self, name: str, arguments: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        """Run ``name``: its ``return`` value (events are skipped); QEMU's error is a SandboxFailedError."""
        message: dict[str, Any] = {"execute": name}
        if arguments:
            message["arguments"] = arguments
        self._sock.settimeout(timeout)
        self._sock.sendall(json.dumps(message).encode() + b"\r\n")
        while True:
            answer = self._read()
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                error = answer["error"]
                raise SandboxFailedError(f"the microVM's QEMU refused {name}: {error.get('desc', error)}")

    def wait_status(self, command: str, wanted: set[str], until: float) -> str:
        """Poll ``command`` (``query-migrate``, ``query-status``) until its status is one of ``wanted``."""
        while True:
            status = str((self.command(command) or {}).get("status", ""))
            if status in wanted:
                return status
            if time.monotonic() >= until:
                raise SandboxFailedError(f"the microVM's {command} still said {status!r} at its deadline")
            time.sleep(0.01)

    def close(self) -> None:
        """Close the connection (QEMU goes on)."""
        self._file.close()
        self._sock.close()

    def _read(self) -> dict[str, Any]:
        line = self._file.readline(_MAX_LINE)
        if not line:
            raise SandboxFailedError("the microVM's monitor closed (QEMU stopped)")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise SandboxFailedError(f"the microVM's monitor said {line[:200]!r}")
        return answer
