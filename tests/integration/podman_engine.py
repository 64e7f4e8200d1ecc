"""A private Podman engine for tests: ``podman system service`` in a tmp root, stopped by pid.

:class:`PodmanEngine` runs ``podman system service --time=0 unix://<root>/podman.sock`` as its own
process (its own session), with ``--root`` (image and container storage, on a tmpfs so a loaded image
goes in fast and leaves with one unmount), ``--runroot`` and ``--tmpdir`` under one directory in /tmp,
``--cgroup-manager cgroupfs`` (no systemd here), ``--events-backend file`` and ``--runtime runc`` (crun
does not work on this machine's cgroup setup). Images travel without a registry:
``docker save IMAGE | podman --root ... load``.

Podman's exec sessions each get a ``conmon`` that waits 300 s after its exec ended (``--exit-delay``)
and outlives the service; :meth:`PodmanEngine.destroy` ends those of this engine by pid (each names the
engine's root on its command line), then removes the root. Files podman keeps outside its root (the SHM
lock file ``/dev/shm/libpod_lock``, ``/var/lib/containers/cache``) are removed when this engine made them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from adk_sandbox.executor.backends.docker.engine import Engine
from tests.conftest import live_processes_whose_cmdline_has

__all__ = ["PODMAN", "PodmanEngine", "PodmanEngineError"]

PODMAN = shutil.which("podman") or "/usr/bin/podman"
START_SECONDS = 30.0
STOP_SECONDS = 15.0
#: Files podman makes outside its root whatever it is told (removed when this engine made them).
_OUTSIDE_ROOT = (Path("/dev/shm/libpod_lock"), Path("/var/lib/containers"))


class PodmanEngineError(RuntimeError):
    """The Podman service could not be started (the reason and the tail of its log)."""


class PodmanEngine:
    """One private ``podman system service``; :meth:`start`, :meth:`load_image`, :meth:`destroy`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="adk-pm-", dir="/tmp"))
        self.socket = str(self.root / "podman.sock")
        self.host = f"unix://{self.socket}"
        self.storage = self.root / "storage"
        self.log_path = self.root / "service.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._made_outside = [path for path in _OUTSIDE_ROOT if not path.exists()]
        self.storage.mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", "size=4g,mode=0700", "adk-pm-storage", str(self.storage)]
        subprocess.run(mount, check=True, capture_output=True)

    def global_arguments(self) -> list[str]:
        """The options every ``podman`` command of this engine takes (the service's and the CLI's)."""
        return [
            "--root", str(self.storage),
            "--runroot", str(self.root / "run"),
            "--tmpdir", str(self.root / "tmp"),
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            "--runtime", "runc",
        ]  # fmt: skip

    def engine(self) -> Engine:
        """The engine as a backend names it."""
        return Engine(host=self.host)

    def start(self, timeout: float = START_SECONDS) -> None:
        """Start the service and wait until its socket answers (:class:`PodmanEngineError` if not)."""
        command = [PODMAN, *self.global_arguments(), "system", "service", "--time=0", self.host]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PodmanEngineError(
                    f"podman system service exited ({self.process.returncode}): {self._tail()}"
                )
            if self.answers():
                return
            time.sleep(0.1)
        raise PodmanEngineError(
            f"podman system service did not answer within {timeout:.0f} s: {self._tail()}"
        )

    def answers(self) -> bool:
        """True when the service answers a ping."""
        if not os.path.exists(self.socket):
            return False
        try:
            client = docker.DockerClient(base_url=self.host, version="1.41", timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (docker.errors.DockerException, OSError):
            return False

    def client(self) -> docker.DockerClient:
        """A plain docker-py client of the service."""
        return docker.DockerClient(base_url=self.host, version="1.41", timeout=60)

    def containers(self) -> list[str]:
        """Ids of every container the engine holds (running or not)."""
        client = self.client()
        try:
            return [str(c.id) for c in client.containers.list(all=True, sparse=True)]
        finally:
            client.close()

    def load_image(self, image: str) -> float:
        """Copy ``image`` from the system Docker engine (``docker save | podman load``); seconds taken."""
        started = time.monotonic()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        try:
            subprocess.run(
                [PODMAN, *self.global_arguments(), "load", "--quiet"],
                stdin=save.stdout,
                check=True,
                capture_output=True,
            )
        finally:
            if save.stdout is not None:
                save.stdout.close()
            if save.wait() != 0:
                raise subprocess.CalledProcessError(save.returncode, ["docker", "save", image])
        return time.monotonic() - started

    def leftover_processes(self) -> list[int]:
        """Pids of live processes that name this engine's root (the service, conmons, runc)."""
        return live_processes_whose_cmdline_has(str(self.root).encode())

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM the service (SIGKILL after ``timeout``), then end what it left running, by pid."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # The exec sessions' conmons (and any container process still running) name this root.
        for pid in self.leftover_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.05)

    def destroy(self) -> None:
        """Stop the service, unmount its storage and remove everything it made."""
        self.stop()
        for mounted in reversed(self._mounts()):  # the containers' overlays first, then the tmpfs
            subprocess.run(["umount", "-l", mounted], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        for path in self._made_outside:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _mounts(self) -> list[str]:
        with open("/proc/self/mounts") as handle:
            points = [line.split()[1] for line in handle]
        return [point for point in points if point.startswith(str(self.root))]

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"
