"""Per-command cost on a local and a remote engine, over the agent channel, in one run.

Run: PYTHONPATH=. .venv/bin/python bench/bench_engines.py [--repeat N] [--quick]   (root: it starts a dockerd)
One private ``dockerd`` (tests/integration/private_engine.py, the base image loaded into it) is reached
three ways at once: its Unix socket, TCP 127.0.0.1 with TLS (certificates made for the run), and ssh (an
sshd on 127.0.0.1 forwarding to the socket, when scripts/setup unpacked one), so every path reaches the
same daemon and they differ only in the connection. Three sessions — unix, TLS, ssh — run ``true`` in
turn (interleaved), then session start (create, start, hardening probe, first command) is timed the same
way (the exec transport, once measured alongside, was removed: docs/docker/agent-channel.md). Prints a
Markdown table for BENCHMARKS.md ("Issue 13, step 1: engines").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from _timing import Row, interleaved, parser, print_section

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, Engine
from tests.integration.private_engine import PrivateEngine, PrivateSshd, find_sshd

TRUE = ExecRequest(language=Language.COMMAND, code="true", timeout=30)


@contextlib.contextmanager
def private_engine() -> Iterator[tuple[PrivateEngine, PrivateSshd | None]]:
    """The private engine with the base image, and an sshd forwarding to it (None without an sshd)."""
    engine = PrivateEngine(tls=True, data_in_memory=True)
    sshd: PrivateSshd | None = None
    try:
        engine.start()
        engine.load_image(BASE_IMAGE)
        binary = find_sshd()
        if binary is not None:
            sshd = PrivateSshd(binary, Path(tempfile.mkdtemp(prefix="adk-sshd-", dir="/tmp")), engine.host)
            sshd.start()
            os.environ["HOME"] = str(sshd.home)  # paramiko finds the key and known hosts there
        yield engine, sshd
    finally:
        if sshd is not None:
            sshd.stop()
            shutil.rmtree(sshd.directory, ignore_errors=True)
        engine.destroy()


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--repeat", type=int, default=60)
    options = arguments.parse_args()
    repeat = 10 if options.quick else options.repeat
    with private_engine() as (engine, sshd):
        engines = {"unix": Engine(host=engine.host), "TLS": engine.engine()}
        if sshd is not None:
            engines["ssh"] = Engine(host=sshd.host)
        backends = {name: DockerBackend(engine=target) for name, target in engines.items()}
        try:
            sessions = {key: backend.session() for key, backend in backends.items()}
            for session in sessions.values():
                session.start()
            commands: dict[str, Callable[[], object]] = {
                key: (lambda s=session: s.execute(TRUE)) for key, session in sessions.items()
            }
            stats = interleaved(commands, repeat)
            starts: dict[str, Callable[[], object]] = {
                key: (lambda b=backend: _start_and_run(b)) for key, backend in backends.items()
            }
            start_stats = interleaved(starts, max(repeat // 6, 3))
            for session in sessions.values():
                session.close()
        finally:
            for backend in backends.values():
                backend.close()
    rows = []
    for name in engines:
        if name != "unix":
            rows.append(Row.latency(f"`true` over {name}", stats[name], "over unix", stats["unix"]))
    for name in engines:
        if name != "unix":
            rows.append(Row.latency(f"session start + first `true`, {name}", start_stats[name], "unix",
                                    start_stats["unix"]))  # fmt: skip
    print_section(
        f"Engines: one private dockerd over its Unix socket, TCP+TLS and ssh (repeat {repeat})",
        rows,
        [
            "All paths reach the same daemon, on loopback: a real network adds its round trips to every "
            "connection (the agent channel makes none per command, only per agent start).",
            "ssh: each connection is a channel (on a few SSH connections) running `docker system dial-stdio` "
            "on the engine's host (a docker CLI process each), paid per agent start.",
        ],
    )


def _start_and_run(backend: DockerBackend) -> None:
    with backend.session() as session:
        session.execute(TRUE)


if __name__ == "__main__":
    main()
