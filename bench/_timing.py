"""The one timing toolkit of bench/: interleaved samples, percentiles, Markdown rows, load, RSS and CPU.

Every benchmark script imports it (``python bench/<file>.py`` puts ``bench/`` first on ``sys.path``).
Measurements run side by side with their anchor in one loop, so machine drift (other processes on a
shared machine) hits both alike; the load average is printed with every table to say how noisy it was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(samples: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``samples``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Stats:
    """Samples of one measurement, in milliseconds (or any unit: the methods do not care)."""

    samples: tuple[float, ...]

    @property
    def p50(self) -> float:
        """The median."""
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        """The 99th percentile (the maximum for fewer than 100 samples)."""
        return percentile(self.samples, 0.99)

    @property
    def p90(self) -> float:
        """The 90th percentile."""
        return percentile(self.samples, 0.9)


def interleaved(
    fns: dict[str, Callable[[], object]],
    repeat: int,
    warm_up: bool = True,
    before: Callable[[], object] | None = None,
) -> dict[str, Stats]:
    """Milliseconds of each function, run in turn ``repeat`` times so machine drift hits all alike.

    Each round starts one function later, so every function follows every other equally often: one that
    leaves work behind (an exec's teardown in dockerd and runc) does not always slow the same neighbour.
    ``before`` runs, untimed, before each sample (waiting for a pool to be ready, say).
    """
    if warm_up:
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for round_number in range(repeat):
        shift = round_number % len(order)
        for name, fn in order[shift:] + order[:shift]:
            if before is not None:
                before()  # untimed: what each sample starts from
            started = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: Stats(tuple(values)) for name, values in samples.items()}


def timed(fn: Callable[[], object], repeat: int, warm_up: bool = True) -> Stats:
    """Milliseconds of ``repeat`` calls of ``fn`` (after one untimed call unless ``warm_up`` is false)."""
    return interleaved({"fn": fn}, repeat, warm_up)["fn"]


@dataclass(frozen=True)
class Row:
    """One line of a result table: ours, the anchor measured in the same run, their ratio and the target."""

    what: str
    ours: str
    anchor: str
    theirs: str
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    @classmethod
    def latency(
        cls, what: str, ours: Stats, anchor: str, theirs: Stats, max_ratio: float | None = None
    ) -> Row:
        """p50/p99 of ours against the anchor's, the ratio of medians checked against ``max_ratio``."""
        ratio = ours.p50 / theirs.p50
        return cls(
            what,
            f"p50 {ours.p50:.2f} / p99 {ours.p99:.2f} ms",
            anchor,
            f"p50 {theirs.p50:.2f} / p99 {theirs.p99:.2f} ms",
            ratio,
            "" if max_ratio is None else f"≤ {max_ratio:g}x",
            None if max_ratio is None else ratio <= max_ratio,
        )


def markdown(rows: Iterable[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| what | ours | anchor | anchor's | ratio | target | met |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(
            f"| {row.what} | {row.ours} | {row.anchor} | {row.theirs} | {ratio} | {row.target} | {met} |"
        )
    return "\n".join(lines)


def load_note() -> str:
    """Date, cores and the 1/5/15-minute load averages: how busy the machine was."""
    one, five, fifteen = os.getloadavg()
    return (
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cpus, "
        f"load average {one:.2f} {five:.2f} {fifteen:.2f}"
    )


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the common ``--quick`` flag (fewer repetitions, same rows)."""
    result = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    result.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    return result


def print_section(title: str, rows: Iterable[Row], notes: Iterable[str] = ()) -> None:
    """A titled table with the machine's load, for BENCHMARKS.md."""
    print(f"### {title}\n\n{load_note()}\n\n{markdown(rows)}\n")
    for note in notes:
        print(f"* {note}")


# --- memory ---------------------------------------------------------------------------------------------


def rss_kib() -> int:
    """The resident set size (VmRSS) of the running process, KiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def pid_rss_kib(pid: int) -> int:
    """The resident set size (VmRSS) of process ``pid``, KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def containers_rss_kib(container_ids: Iterable[str]) -> int:
    """Resident memory of every host process of these containers (KiB).

    runc's own processes are in the container's cgroup; gVisor's (sandbox, gofer, shim) name it on their
    command line.
    """
    wanted = [container.encode() for container in container_ids]
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as cgroup, open(f"/proc/{pid}/cmdline", "rb") as line:
                seen = cgroup.read() + line.read()
            if any(container in seen for container in wanted):
                total += pid_rss_kib(int(pid))
        except (OSError, StopIteration):
            continue
    return total


class RssSampler:
    """Samples VmRSS in a thread while a block runs; ``peak_growth_mib`` is the maximum over the baseline.

    The kernel's high-water mark (VmHWM) cannot be reset from here, so the peak is sampled every
    ``interval`` seconds instead (a short spike between samples can be missed; 2 ms is far below the
    duration of any allocation that would matter).
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-rss", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kib())

    def __enter__(self) -> RssSampler:
        self.baseline = self.peak = rss_kib()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib())

    @property
    def peak_growth_mib(self) -> float:
        """The largest RSS seen above the baseline, MiB."""
        return (self.peak - self.baseline) / 1024


# --- cpu ------------------------------------------------------------------------------------------------


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_cpu_seconds(pid: int, with_reaped_children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` (all threads), plus its reaped children's if asked."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + ((cutime + cstime) if with_reaped_children else 0)) / CLOCK_TICKS


def cgroup_cpu_seconds(container_id: str) -> float:
    """CPU seconds used by every process of a runc container so far (cgroup v1 cpuacct)."""
    for path in (
        f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage",
        f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage",
    ):
        if os.path.exists(path):
            with open(path, encoding="ascii") as usage:
                return int(usage.read()) / 1e9
    raise FileNotFoundError(f"no cpuacct cgroup for container {container_id}")


DAEMON_PID_FILES = {
    "dockerd": "/var/run/docker.pid",
    "containerd": "/var/run/docker/containerd/containerd.pid",
}


def daemon_pid(name: str) -> int:
    """The pid of the Docker daemon (``dockerd``) or of the containerd it started (``containerd``)."""
    with open(DAEMON_PID_FILES[name], encoding="ascii") as pid_file:
        return int(pid_file.read().strip())
