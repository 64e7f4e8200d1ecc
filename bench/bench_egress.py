"""Egress under a NetworkPolicy against the same traffic on the host, side by side in one run (issue 23).

Run: PYTHONPATH=. .venv/bin/python bench/bench_egress.py [--quick] [--runtimes runc,runsc,bwrap]
[--megabytes 200]
Prints Markdown tables for BENCHMARKS.md, for each runtime:

* a 200 MB download from a loopback HTTP server on the host, through the session's policy (the agent's
  proxy endpoint on 127.0.0.1 in the sandbox, the channel, the host's relay) against the same download by
  the same client on the host, straight to the server: throughput and its ratio (goal ≥ 0.5x);
* the latency of one small request on a new connection (connect, request, answer, close), many in a row:
  through the policy against the same on the host, and what the policy adds at the median (goal ≤ 2 ms).

Each Docker runtime's name says how its connections travel (``session.egress_mode``): ``unix``, the direct
path (a local engine's runc: a Unix socket bound read-only into the container, over which the agent
passes each client's socket to the host) or ``frames`` (the agent channel: gVisor). ``bwrap`` is the
host ``ProcessBackend`` under bubblewrap with
the same policy: its proxy is a forwarder inside (Python) passing each connection to a Unix socket of the
host, no channel and no engine between.

The download's floor is measured alongside (Docker runtimes): the same bytes written straight into a
``docker exec``'s stdin (``cat > /dev/null`` in a container of the same runtime, over the hijacked
attach connection), which is the path the agent channel's host-to-sandbox direction takes through the engine.

Both sides run one client script (Python's standard library, a raw socket, 1 MiB reads), which times
itself: process start is not counted on either side. The rounds alternate sandbox and host, so machine
drift hits both alike. The server sends from one buffer in memory; ``allowed.test`` is pinned to 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import docker
from _timing import Row, Stats, parser, print_section

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.bwrap import get_enforcer
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.backends.process import ProcessBackend
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import SandboxPolicy
from tests.loopback_server import LoopbackServer

CHUNK = 1 << 20
SMALL = b"ok"

CLIENT = """
import json, os, socket, sys, time, urllib.parse
PORT, MODE, COUNT, VIA_PROXY = {port}, {mode!r}, {count}, {via_proxy}
buffer = bytearray(1 << 20)
def fetch(path):
    if VIA_PROXY:
        proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
        s = socket.create_connection((proxy.hostname, proxy.port))
        target = f'http://allowed.test:{{PORT}}{{path}}'
    else:
        s = socket.create_connection(('127.0.0.1', PORT))
        target = path
    s.sendall(f'GET {{target}} HTTP/1.1\\r\\nHost: allowed.test:{{PORT}}\\r\\n\\r\\n'.encode())
    got = 0
    while n := s.recv_into(buffer):
        got += n
    s.close()
    return got
if MODE == 'download':
    start = time.perf_counter()
    got = fetch('/big')
    print(json.dumps({{'seconds': time.perf_counter() - start, 'bytes': got}}))
else:
    fetch('/small')
    samples = []
    for _ in range(COUNT):
        start = time.perf_counter()
        fetch('/small')
        samples.append((time.perf_counter() - start) * 1000)
    print(json.dumps({{'ms': samples}}))
"""


class Server(LoopbackServer):
    """A loopback HTTP server: ``/big`` sends ``size`` bytes from one buffer, anything else two bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.block = memoryview(b"x" * CHUNK)
        super().__init__()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                head += chunk
            big = head.startswith(b"GET /big ")
            length = self.size if big else len(SMALL)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % length)
            if not big:
                conn.sendall(SMALL)
                return
            left = self.size
            while left > 0:
                conn.sendall(self.block[: min(left, CHUNK)])
                left -= CHUNK


def client(port: int, mode: str, count: int, via_proxy: bool) -> str:
    return CLIENT.format(port=port, mode=mode, count=count, via_proxy=via_proxy)


def on_host(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def in_sandbox(session: DockerSession | ProcessBackend, code: str) -> dict[str, object]:
    done = session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=300))
    if done.exit_code != 0:
        raise RuntimeError(f"the client failed in the sandbox: {done.stderr or done.stdout}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def stdin_floor(client: docker.DockerClient, container_id: str | None, size: int) -> float:
    """Seconds to write ``size`` bytes into a fresh exec's stdin (``cat > /dev/null``) until it ends."""
    created = client.api.exec_create(container_id, ["sh", "-c", "cat > /dev/null; echo done"], stdin=True)
    attached: Any = client.api.exec_start(created["Id"], socket=True)
    sock: socket.socket = attached._sock
    block = memoryview(b"x" * CHUNK)
    start = time.perf_counter()
    left = size
    while left > 0:
        sock.sendall(block[: min(left, CHUNK)])
        left -= CHUNK
    sock.shutdown(socket.SHUT_WR)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    seconds = time.perf_counter() - start
    sock.close()
    assert answer.endswith(b"done\n"), answer
    return seconds


def measure(runtime: str | None, server: Server, rounds: int, requests: int) -> list[Row]:
    policy = NetworkPolicy(allow=[f"allowed.test:{server.port}"], hosts={"allowed.test": ["127.0.0.1"]})
    name = runtime or "runc"
    seconds: dict[str, list[float]] = {"sandbox": [], "host": [], "floor": []}
    latency: dict[str, list[float]] = {"sandbox": [], "host": []}
    engine = docker.from_env()
    bare = engine.containers.run(
        "adk-sandbox/base:latest", ["sleep", "3600"], detach=True, network_mode="none", runtime=runtime,
        labels={"adk-sandbox-bench": "egress"},
    )  # fmt: skip
    try:
        with DockerBackend(network=policy, runtime=runtime) as backend, backend.session() as session:
            for _ in range(rounds):
                seconds["floor"].append(stdin_floor(engine, bare.id, server.size))
                rows_for_round(session, server, requests, seconds, latency)
            log = session.network_log()
            name = f"{name} ({session.egress_mode})"  # unix: the direct path; frames: the agent channel
    finally:
        bare.remove(force=True)
        engine.close()
    refused = [entry for entry in log.entries if entry.decision != "allowed"]
    assert not refused, refused
    return rows(name, server.size, rounds, seconds, latency)


def measure_bwrap(server: Server, rounds: int, requests: int) -> list[Row]:
    """The same rounds through a host process under bubblewrap and the same policy (no floor: no engine)."""
    policy = NetworkPolicy(allow=[f"allowed.test:{server.port}"], hosts={"allowed.test": ["127.0.0.1"]})
    seconds: dict[str, list[float]] = {"sandbox": [], "host": [], "floor": []}
    latency: dict[str, list[float]] = {"sandbox": [], "host": []}
    backend = ProcessBackend.with_sandbox(
        get_enforcer(), SandboxPolicy.builder().allow_process_spawn().build(), network=policy
    )
    for _ in range(rounds):
        rows_for_round(backend, server, requests, seconds, latency)
    refused = [entry for entry in backend.network_log().entries if entry.decision != "allowed"]
    assert not refused, refused
    return [row for row in rows("bwrap", server.size, rounds, seconds, latency) if "floor" not in row.what]


def rows_for_round(
    session: DockerSession | ProcessBackend,
    server: Server,
    requests: int,
    seconds: dict[str, list[float]],
    latency: dict[str, list[float]],
) -> None:
    """One round: the download on each side, then the small requests on each side."""
    for side in ("sandbox", "host"):
        code = client(server.port, "download", 0, via_proxy=side == "sandbox")
        got = in_sandbox(session, code) if side == "sandbox" else on_host(code)
        assert isinstance(got["bytes"], int) and got["bytes"] > server.size, got  # the head and the body
        seconds[side].append(float(str(got["seconds"])))
    for side in ("sandbox", "host"):
        code = client(server.port, "latency", requests, via_proxy=side == "sandbox")
        got = in_sandbox(session, code) if side == "sandbox" else on_host(code)
        samples = got["ms"]
        assert isinstance(samples, list)
        latency[side] += [float(sample) for sample in samples]


def rows(
    name: str, size: int, rounds: int, seconds: dict[str, list[float]], latency: dict[str, list[float]]
) -> list[Row]:
    """The table's rows for one runtime."""
    megabytes = size / 1e6
    floor = statistics.median(seconds["floor"] or [float("nan")])
    ours, theirs = statistics.median(seconds["sandbox"]), statistics.median(seconds["host"])
    ratio = theirs / ours
    ours_ms, theirs_ms = Stats(tuple(latency["sandbox"])), Stats(tuple(latency["host"]))
    added = ours_ms.p50 - theirs_ms.p50
    return [
        Row(
            f"{name}: {megabytes:.0f} MB download through the policy (median of {rounds})",
            f"{megabytes / ours:.0f} MB/s ({ours:.2f} s)",
            "the same client on the host, straight to the server",
            f"{megabytes / theirs:.0f} MB/s ({theirs:.2f} s)",
            ratio,
            "≥ 0.5x",
            ratio >= 0.5,
        ),
        Row(
            f"{name}: the floor: {megabytes:.0f} MB into a `docker exec`'s stdin",
            f"{megabytes / floor:.0f} MB/s ({floor:.2f} s)",
            "the same client on the host, straight to the server",
            f"{megabytes / theirs:.0f} MB/s ({theirs:.2f} s)",
            theirs / floor,
            "",
            None,
        ),
        Row(
            f"{name}: a small request on a new connection ({len(latency['sandbox'])} in all)",
            f"p50 {ours_ms.p50:.2f} / p90 {ours_ms.p90:.2f} ms; **+{added:.2f} ms** at p50",
            "the same client on the host, straight to the server",
            f"p50 {theirs_ms.p50:.2f} / p90 {theirs_ms.p90:.2f} ms",
            ours_ms.p50 / theirs_ms.p50,
            "≤ 2 ms added",
            added <= 2.0,
        ),
    ]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc", help="comma-separated: runc, runsc")
    args.add_argument("--megabytes", type=int, default=200, help="the size of the download")
    options = args.parse_args()
    rounds, requests = (2, 50) if options.quick else (5, 200)
    server = Server(options.megabytes * 1_000_000)
    rows: list[Row] = []
    try:
        for runtime in options.runtimes.split(","):
            if runtime == "bwrap":
                rows += measure_bwrap(server, rounds, requests)
            else:
                rows += measure(None if runtime == "runc" else runtime, server, rounds, requests)
    finally:
        server.close()
    print_section(
        "Egress by domain: a download and a connection through the policy (issue 23)",
        rows,
        ["ratio for the download: host time / sandbox time (throughput ratio); for a request: p50 / p50"],
    )


if __name__ == "__main__":
    main()
