"""Terminals: a keystroke's round trip and a terminal's throughput, against ``docker exec -it`` (issue 35).

Run: PYTHONPATH=. .venv/bin/python bench/bench_pty.py [--quick] [--runtimes runc,runsc]
Prints a Markdown table for BENCHMARKS.md, for each runtime:

* a keystroke's round trip: one byte written to ``cat`` on the terminal, its echo read back (the
  terminal's own echo, as a person sees a key they typed): ``session.open_pty(["cat"])`` against
  ``docker exec -it <the same container> cat`` driven through a pseudo-terminal on the host, alternated,
  one byte after another (target: p50 ≤ 5 ms on runc);
* throughput: ``cat`` of a 100 MB text file on the terminal, read to its end: ours against the same
  ``docker exec -it`` (target ≥ 100 MB/s), and the floor, the same ``cat`` on a terminal inside the
  container read by ``script`` (nothing crosses the container's boundary).

Both sides run in the same container (the session's), so the image, the runtime and the limits are the same.

``--host`` adds the host's own terminals: ``ProcessBackend.open_pty(["cat", FILE])`` plain and under
bubblewrap, against the floor of this machine's kernel: the same ``cat`` on a bare pseudo-terminal of the
host (its default mode, as a terminal's program has it), read 1 MiB at a time, nothing else in between;
and that terminal in raw mode, the kernel's best.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shutil
import subprocess
import tempfile
import time
import tty

from _timing import Row, Stats, parser, print_section

from adk_sandbox.executor import ExecRequest, ProcessBackend, SandboxPolicy
from adk_sandbox.executor.backends.bwrap import get_enforcer
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession

_BIG = "/tmp/adk-bench-big.txt"  # inside the sandbox
_MEGABYTES = 100


class ExecTerminal:
    """``docker exec -it CONTAINER argv`` on a pseudo-terminal of this host (what a person's terminal is)."""

    def __init__(self, container: str, argv: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            ["docker", "exec", "-it", container, *argv], stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)

    def write(self, data: bytes) -> None:
        """Type ``data``."""
        os.write(self.master, data)

    def read(self, timeout: float = 30) -> bytes:
        """What came (b"" at the end); TimeoutError when nothing did in ``timeout`` seconds."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            raise TimeoutError
        try:
            return os.read(self.master, 1 << 20)
        except OSError:  # EIO: the other end is closed
            return b""

    def close(self) -> None:
        """End the exec and its terminal."""
        self.process.kill()
        self.process.wait()
        os.close(self.master)


def round_trips(session: DockerSession, container: str, count: int) -> dict[str, Stats]:
    """One byte written, its echo read: ours and ``docker exec -it``, alternated."""
    ours = session.open_pty(["cat"])
    theirs = ExecTerminal(container, ["cat"])
    time.sleep(1.0)  # both started (the exec's CLI is slow to attach)
    for side in (ours, theirs):  # drain whatever the start printed
        try:
            while side.read(timeout=0.2):
                pass
        except TimeoutError:
            pass
    samples: dict[str, list[float]] = {"ours": [], "docker exec -it": []}
    for number in range(count):
        key = bytes([ord("a") + number % 26])
        for name, side in (("ours", ours), ("docker exec -it", theirs)):
            started = time.perf_counter()
            side.write(key)
            echoed = b""
            while key not in echoed:
                echoed += side.read(timeout=30)
            samples[name].append((time.perf_counter() - started) * 1000)
        if number % 50 == 49:  # a newline now and then: cat's line buffer stays small
            for side in (ours, theirs):
                side.write(b"\r")
    ours.close()
    theirs.close()
    return {name: Stats(tuple(values)) for name, values in samples.items()}


def cat_seconds(read_all: object) -> float:
    started = time.perf_counter()
    total = read_all()  # type: ignore[operator]
    seconds = time.perf_counter() - started
    assert total >= _MEGABYTES * 1_000_000, f"only {total} bytes came"
    return seconds


def ours_cat(session: DockerSession) -> int:
    total = 0
    with session.open_pty(["cat", _BIG]) as terminal:
        while piece := terminal.read(timeout=60):
            total += len(piece)
    return total


def exec_cat(container: str) -> int:
    terminal, total = ExecTerminal(container, ["cat", _BIG]), 0
    try:
        while piece := terminal.read(timeout=60):
            total += len(piece)
    finally:
        terminal.close()
    return total


def floor_cat(session: DockerSession) -> float:
    """Seconds of the same ``cat`` on a terminal inside the container, read by ``script`` into /dev/null."""
    timed = f"s=$(date +%s.%N); script -qc 'cat {_BIG}' /dev/null > /dev/null; e=$(date +%s.%N); echo $s $e"
    result = session.execute(ExecRequest(argv=("sh", "-c", timed), timeout=120))
    start, end = (float(x) for x in result.stdout.split())
    return end - start


def measure(runtime: str | None, keystrokes: int, rounds: int) -> list[Row]:
    name = runtime or "runc"
    with DockerBackend(runtime=runtime) as backend, backend.session() as session:
        made = session.execute(
            ExecRequest(
                argv=(
                    "sh",
                    "-c",
                    f"yes 'a line of text of a terminal, 0123456789' | head -c "
                    f"{_MEGABYTES * 1_000_000} > {_BIG}",
                ),
                timeout=120,
            )
        )
        assert made.exit_code == 0, made.stderr
        container = session.container_id
        assert container is not None
        keys = round_trips(session, container, keystrokes)
        seconds: dict[str, list[float]] = {"ours": [], "exec": [], "floor": []}
        for _ in range(rounds):
            seconds["ours"].append(cat_seconds(lambda: ours_cat(session)))
            seconds["exec"].append(cat_seconds(lambda: exec_cat(container)))
            seconds["floor"].append(floor_cat(session))
    ours, theirs, floor = (sorted(v)[len(v) // 2] for v in seconds.values())
    rate = _MEGABYTES / ours
    return [
        Row.latency(
            f"{name}: a keystroke's echo ({keystrokes} keys)",
            keys["ours"],
            "`docker exec -it` (same container)",
            keys["docker exec -it"],
        ),
        Row(
            f"{name}: `cat` of {_MEGABYTES} MB on the terminal (median of {rounds})",
            f"{rate:.0f} MB/s ({ours:.2f} s)",
            "`docker exec -it` (same container)",
            f"{_MEGABYTES / theirs:.0f} MB/s ({theirs:.2f} s)",
            theirs / ours,
            "≥ 100 MB/s",
            rate >= 100,
        ),
        Row(
            f"{name}: the floor: the same `cat` on a terminal inside, read by `script`",
            f"{_MEGABYTES / floor:.0f} MB/s ({floor:.2f} s)",
            "",
            "",
        ),
    ]


def host_rows(rounds: int) -> list[Row]:
    """The host's terminals (plain, bubblewrap) against a bare pseudo-terminal of this host (the floor)."""
    directory = tempfile.mkdtemp(prefix="adk-bench-pty-")
    big = os.path.join(directory, "big.txt")
    line = b"a line of text of a terminal, 0123456789\n"
    with open(big, "wb") as handle:
        handle.write((line * (_MEGABYTES * 1_000_000 // len(line) + 1))[: _MEGABYTES * 1_000_000])
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read(directory).build()
    backends: dict[str, ProcessBackend] = {
        "host `process`": ProcessBackend(),
        "bubblewrap": ProcessBackend.with_sandbox(get_enforcer(), policy),
    }

    def backend_cat(backend: ProcessBackend) -> int:
        total = 0
        with backend.open_pty(["cat", big]) as terminal:
            while piece := terminal.read(timeout=60):
                total += len(piece)
        return total

    def bare_cat(raw: bool) -> int:
        master, slave = pty.openpty()
        if raw:
            tty.setraw(slave)
        process = subprocess.Popen(
            ["cat", big], stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        os.close(slave)
        total = 0
        with contextlib.suppress(OSError):  # EIO: the other end is closed
            while piece := os.read(master, 1 << 20):
                total += len(piece)
        process.wait()
        os.close(master)
        return total

    seconds: dict[str, list[float]] = {name: [] for name in (*backends, "floor", "raw")}
    try:
        for _ in range(rounds):
            for name, backend in backends.items():
                seconds[name].append(cat_seconds(lambda backend=backend: backend_cat(backend)))
            seconds["floor"].append(cat_seconds(lambda: bare_cat(raw=False)))
            seconds["raw"].append(cat_seconds(lambda: bare_cat(raw=True)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    floor = sorted(seconds.pop("floor"))[rounds // 2]
    raw = sorted(seconds.pop("raw"))[rounds // 2]
    rows = []
    for name, taken in seconds.items():
        ours = sorted(taken)[rounds // 2]
        rate = _MEGABYTES / ours
        rows.append(
            Row(
                f"{name}: `cat` of {_MEGABYTES} MB on `open_pty` (median of {rounds})",
                f"{rate:.0f} MB/s ({ours:.2f} s)",
                "a bare pseudo-terminal of this host, 1 MiB reads",
                f"{_MEGABYTES / floor:.0f} MB/s ({floor:.2f} s)",
                floor / ours,
                "≥ 100 MB/s",
                rate >= 100,
            )
        )
    rows.append(
        Row(
            "the kernel's best here: the bare terminal in raw mode (no output processing)",
            f"{_MEGABYTES / raw:.0f} MB/s ({raw:.2f} s)",
            "",
            "",
        )
    )
    return rows


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc", help="comma-separated: runc, runsc (empty: none)")
    args.add_argument("--host", action="store_true", help="also the host and bubblewrap terminals")
    options = args.parse_args()
    keystrokes, rounds = (100, 2) if options.quick else (500, 5)
    rows: list[Row] = []
    for runtime in filter(None, options.runtimes.split(",")):
        rows += measure(None if runtime == "runc" else runtime, keystrokes, rounds)
    if options.host:
        rows += host_rows(rounds)
    print_section(
        "Terminals: a keystroke's echo and a terminal's throughput (issue 35)",
        rows,
        [
            "keystroke ratio: our p50 / docker exec -it's p50; throughput ratio: their time / ours",
            "target for the keystroke: p50 ≤ 5 ms on runc",
        ],
    )


if __name__ == "__main__":
    main()
