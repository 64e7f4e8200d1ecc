"""gVisor checkpoint and restore through two Docker engines: this machine's 20.10 and a current one (26.x).

Issue 36's target (resume and fork with processes at p50 <= 300 ms, 200 MB of process memory) sits below
Docker 20.10's restore path, which stores the checkpoint in containerd's content store at every restore
(docs/pause.md). This runs the same container (the base image under runsc, network none, a program holding
``--mb`` MiB of random bytes) through both engines, alternated round by round, and times the engine's own
calls only, through the library's :class:`ContainerCheckpoints`: a checkpoint that stops the container
(until it has stopped), and a start from it (until the engine answers). The current engine is the one
``scripts/modern-engine`` builds (tests/integration/modern_engine.py), run here with its experimental
features on, which checkpoints need.

Run: .venv/bin/python bench/bench_checkpoint_engines.py [--rounds N] [--mb M]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' engine helper

from adk_sandbox.executor.backends.docker import BASE_IMAGE
from adk_sandbox.executor.backends.docker._checkpoint import ContainerCheckpoints
from adk_sandbox.executor.backends.docker._daemon import connect
from tests.integration.modern_engine import ModernEngine

HOLD = "import os, time\nb = os.urandom({mb} << 20)\nopen('/tmp/ready', 'w').close()\ntime.sleep(1e9)\n"


class _ExperimentalEngine(ModernEngine):
    """The current engine with ``experimental`` on (``docker checkpoint`` is an experimental feature)."""

    def _config(self) -> dict[str, object]:
        return {**super()._config(), "experimental": True}

    def _dockerd_argv(self, dockerd: str = "dockerd") -> list[str]:
        # containerd writes a checkpoint's images to a temporary directory first: the engine's /tmp is a
        # small tmpfs, so they go under the engine's own directory (on disk) instead.
        scratch = self.root / "scratch"
        scratch.mkdir(exist_ok=True)
        return ["/usr/bin/env", f"TMPDIR={scratch}", *super()._dockerd_argv(dockerd)]


class _Subject:
    """One engine's container holding the memory, and its checkpoint timings."""

    def __init__(self, name: str, client: docker.DockerClient, mb: int, runtime: str = "runsc") -> None:
        self.name, self.client = name, client
        self.container: Any = client.containers.run(
            BASE_IMAGE,
            ["python3", "-c", HOLD.format(mb=mb)],
            runtime=runtime,
            network_mode="none",
            mem_limit=f"{mb + 384}m",
            detach=True,
        )
        self.checkpoints = ContainerCheckpoints(client, str(self.container.id))
        self.pauses: list[float] = []
        self.resumes: list[float] = []
        self._ready()

    def _ready(self) -> None:
        deadline = time.monotonic() + 120
        while self.container.exec_run(["test", "-e", "/tmp/ready"]).exit_code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the program did not get ready")
            time.sleep(0.2)

    def round(self) -> None:
        started = time.monotonic()
        name = self.checkpoints.create(stop=True)
        self.pauses.append((time.monotonic() - started) * 1000)
        started = time.monotonic()
        self.checkpoints.restore(name)
        self.resumes.append((time.monotonic() - started) * 1000)
        self._ready()  # the same program, its file in the restored memory
        self.checkpoints.delete(name)

    def close(self) -> None:
        self.container.remove(force=True)


def main() -> None:
    """Alternate the two engines' rounds; print each figure's median and the ratio current/20.10."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    engine = _ExperimentalEngine(data_in_memory=False)  # a 200 MB checkpoint does not fit its tmpfs
    engine.start()
    subjects: list[_Subject] = []
    try:
        engine.load_image(BASE_IMAGE)
        modern = connect(engine=engine.local_engine())  # the library's client: it knows its engine
        subjects = [
            _Subject("Docker 20.10", connect(), args.mb),
            _Subject(f"Docker {engine.version()['Version']}", modern, args.mb),
        ]
        for index in range(args.rounds):
            for subject in subjects if index % 2 == 0 else reversed(subjects):
                subject.round()
        old, new = subjects
        print(f"gVisor, a program holding {args.mb} MiB; medians of {args.rounds} rounds, alternated\n")
        print(f"| call | {old.name} | {new.name} | ratio |\n|---|---|---|---|")
        for what, first, second in (
            ("checkpoint (stopped)", old.pauses, new.pauses),
            ("start from it", old.resumes, new.resumes),
        ):
            a, b = statistics.median(first), statistics.median(second)
            print(f"| {what} | {a:.0f} ms | {b:.0f} ms | {b / a:.2f}x |")
    finally:
        for subject in subjects:
            subject.close()
        engine.destroy()


if __name__ == "__main__":
    main()
