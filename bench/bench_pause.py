"""Pause and resume: in place (``keep_memory=True``) and to disk (gVisor's, CRIU's, a microVM's migration).

Run: PYTHONPATH=. .venv/bin/python bench/bench_pause.py [--quick] [--runtimes runc,runsc]
[--disk-runtimes runsc,runc] [--no-disk] [--no-microvm]
Prints Markdown tables for BENCHMARKS.md, with a session whose background program holds 200 MB of
touched memory:

* in place, for each runtime: ``session.resume()`` of a paused session, and the first command after it
  (what a caller waits for), against a command of the same session that was never paused (the anchor:
  what resuming adds); ``session.pause(keep_memory=True)``;
* on disk (``DockerBackend(runtime=..., checkpoints=True)``, gVisor and runc, ``--disk-runtimes``; needs
  dockerd's experimental checkpoints, and CRIU for runc): ``pause()`` and ``resume()`` with the same
  anchor; ``fork(processes=True)``, and a session started from ``snapshot(processes=True)`` (of an idle
  session, of one holding 200 MB), against starting a new session of the same backend; the host memory
  the session holds running and paused (the resident memory of the container's host processes: gVisor's
  sandbox, gofer and shim, runc's processes); the checkpoint's size on disk, with 200 MB held and for an
  idle session; 20 idle sessions paused together (host memory, disk each, this process's growth) and each
  resumed;
* the microVM (TCG, ``--no-microvm`` skips it), idle and holding 200 MB: ``pause()`` (QEMU's migration to a
  file) and ``resume()``, the first command after it against one never paused, the machine's file, and
  ``resume()`` after ``pause(keep_memory=True)``; ``fork(processes=True)`` of the running VM, and of it
  paused in place (one machine file serves each fork), and sessions from one ``snapshot(processes=True)``,
  each until it answers a command, against starting a new session (its boot).

The issue's targets: resume and fork-with-processes p50 ≤ 300 ms; a paused session's host memory
≤ 1 MiB; an idle one's disk ≤ 4 MiB.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _timing import Row, Stats, containers_rss_kib, parser, print_section, rss_kib

from adk_sandbox.executor import ExecRequest
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.types import ResourceLimits

HOLDER = (  # random bytes: memory that neither compresses nor is shared, as a real program's heap
    "import os, time\nblock = os.urandom(200 * 1024 * 1024)\ntime.sleep(100000)\n"
)
TRUE = ExecRequest(argv=("true",), timeout=30)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


@dataclass
class _Cycles:
    """Milliseconds of each round: pause, resume, the first command after it, a second one (the anchor)."""

    pauses: list[float] = field(default_factory=list)
    resumes: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)


def _cycle(cycles: _Cycles, session: Any, pause: Callable[[], None], settle: float = 0.0) -> None:
    """One round: ``pause()``, ``settle`` seconds (untimed), ``session.resume()``, then two commands."""
    started = time.perf_counter()
    pause()
    cycles.pauses.append(_ms(started))
    time.sleep(settle)
    started = time.perf_counter()
    session.resume()
    cycles.resumes.append(_ms(started))
    for kept in (cycles.firsts, cycles.plain):
        started = time.perf_counter()
        session.execute(TRUE)
        kept.append(_ms(started))


def measure(runtime: str | None, rounds: int) -> list[Row]:
    name = runtime or "runc"
    limits = ResourceLimits(memory_mb=512)
    with DockerBackend(runtime=runtime, limits=limits) as backend, backend.session() as session:
        _hold(session)
        cycles = _Cycles()
        for _ in range(rounds):
            _cycle(cycles, session, lambda: session.pause(keep_memory=True), settle=0.05)
        _check_alive(session)
        pauses, resumes, firsts, plain = cycles.pauses, cycles.resumes, cycles.firsts, cycles.plain
    anchor = "a command of the same session, never paused"
    return [
        Row(
            f"{name}: `resume()` of a session holding 200 MB",
            f"p50 {Stats(tuple(resumes)).p50:.1f} / p99 {Stats(tuple(resumes)).p99:.1f} ms",
            "",
            "",
            None,
            "p50 ≤ 300 ms",
            Stats(tuple(resumes)).p50 <= 300,
        ),
        Row.latency(
            f"{name}: the first command after `resume()`", Stats(tuple(firsts)), anchor, Stats(tuple(plain))
        ),
        Row(
            f"{name}: `pause(keep_memory=True)`",
            f"p50 {Stats(tuple(pauses)).p50:.1f} / p99 {Stats(tuple(pauses)).p99:.1f} ms",
            "",
            "",
        ),
    ]


def _hold(session: DockerSession) -> None:
    held = session.execute(
        ExecRequest(
            argv=("sh", "-c", 'python3 -c "$HOLDER" >/dev/null 2>&1 &'),
            env={"HOLDER": HOLDER},
            timeout=60,
            background=True,
        )
    )
    assert held.exit_code == 0, held
    time.sleep(3)  # the 200 MB touched


def _criu_restore_ms(container_id: str) -> float | None:
    """CRIU's own time in the container's last restore: the last timestamp of the log runc keeps for it.

    containerd keeps ``work/restore.log`` in the running task's directory; CRIU stamps each line with the
    seconds since it began. None when there is no such log (not runc, or another exec-root).
    """
    logs = glob.glob(f"/run/docker/containerd/daemon/*/moby/{container_id}/work/restore.log")
    if not logs:
        return None
    with open(logs[0]) as log:
        stamps = re.findall(r"^\((\d+\.\d+)\)", log.read(), re.MULTILINE)
    return float(stamps[-1]) * 1000 if stamps else None


def _checkpoint_bytes(session: DockerSession) -> int:
    client = session._client
    root = os.path.join(client.info()["DockerRootDir"], "containers", session.container_id, "checkpoints")
    return sum(
        os.lstat(os.path.join(parent, name)).st_blocks * 512
        for parent, _, names in os.walk(root)
        for name in names
    )


def measure_disk(runtime: str, rounds: int) -> list[Row]:
    """The checkpoint to disk: pause and resume times, host memory and disk of a paused session."""
    limits = ResourceLimits(memory_mb=512)
    name = _NAMES[runtime]
    with DockerBackend(runtime=runtime, checkpoints=True, limits=limits) as backend:
        with backend.session() as idle:
            idle.pause()
            idle_disk = _checkpoint_bytes(idle)
            idle_rss = containers_rss_kib([idle.container_id])
            idle_starts = _starts_from_snapshot(backend, idle, rounds)
        with backend.session() as session:
            _hold(session)
            running_rss = containers_rss_kib([session.container_id])
            cycles, paused_rss, disk = _Cycles(), [], []

            def to_disk() -> None:
                session.pause()
                paused_rss.append(
                    containers_rss_kib([session.container_id])
                )  # timed too: small beside the pause
                disk.append(_checkpoint_bytes(session))

            criu_restores = []  # runc: how much of each resume is CRIU's own restore
            for _ in range(rounds):
                _cycle(cycles, session, to_disk)
                if (criu_ms := _criu_restore_ms(session.container_id)) is not None:
                    criu_restores.append(criu_ms)
            _check_alive(session)
            pauses, resumes, firsts, plain = cycles.pauses, cycles.resumes, cycles.firsts, cycles.plain
            forks, fresh = [], []
            for _ in range(max(3, rounds // 2)):
                started = time.perf_counter()
                child = session.fork(processes=True)
                forks.append(_ms(started))
                _check_alive(child)
                child.close()
                started = time.perf_counter()
                with backend.session() as new:
                    new.start()
                    fresh.append(_ms(started))
            held_starts = _starts_from_snapshot(backend, session, max(3, rounds // 2))
    anchor = "a command of the same session, never paused"
    resume = Stats(tuple(resumes))
    fork = Stats(tuple(forks))
    rows = [
        Row(
            f"{name} on disk: `resume()` of a session holding 200 MB",
            f"p50 {resume.p50:.0f} / p99 {resume.p99:.0f} ms",
            "",
            "",
            None,
            "p50 ≤ 300 ms",
            resume.p50 <= 300,
        ),
        Row.latency(
            f"{name} on disk: the first command after `resume()`",
            Stats(tuple(firsts)),
            anchor,
            Stats(tuple(plain)),
        ),
        Row(
            f"{name} on disk: `pause()` of a session holding 200 MB",
            f"p50 {Stats(tuple(pauses)).p50:.0f} / p99 {Stats(tuple(pauses)).p99:.0f} ms",
            "",
            "",
        ),
        Row.latency(
            f"{name}: `fork(processes=True)` of a session holding 200 MB",
            fork,
            "a new session of the same backend, started",
            Stats(tuple(fresh)),
        ),
        Row(
            f"{name}: the same fork against its target",
            f"p50 {fork.p50:.0f} ms",
            "",
            "",
            None,
            "p50 ≤ 300 ms",
            fork.p50 <= 300,
        ),
        Row.latency(
            f"{name}: a session from `snapshot(processes=True)` of an idle session",
            Stats(tuple(idle_starts)),
            "a new session of the same backend, started",
            Stats(tuple(fresh)),
        ),
        Row.latency(
            f"{name}: a session from `snapshot(processes=True)` of a session holding 200 MB",
            Stats(tuple(held_starts)),
            "a new session of the same backend, started",
            Stats(tuple(fresh)),
        ),
        Row(
            f"{name} on disk: host memory of the paused session",
            f"{max(paused_rss)} KiB (running: {running_rss // 1024} MiB)",
            "",
            "",
            None,
            "≤ 1 MiB",
            max(paused_rss) <= 1024,
        ),
        Row(f"{name} on disk: the checkpoint, 200 MB held", f"{max(disk) / 2**20:.0f} MiB", "", ""),
        Row(
            f"{name} on disk: the checkpoint of an idle session",
            f"{idle_disk / 2**20:.1f} MiB (host memory paused: {idle_rss} KiB)",
            "",
            "",
            None,
            "≤ 4 MiB",
            idle_disk <= 4 * 2**20,
        ),
    ]
    if criu_restores:  # runc: how much of the resume is CRIU's, the rest being the engine's path
        criu = Stats(tuple(criu_restores))
        share = f"{100 * criu.p50 / resume.p50:.0f} % of the resume; the rest is the engine's"
        what = f"{name} on disk: CRIU's own restore in it"
        rows.insert(1, Row(what, f"p50 {criu.p50:.0f} ms ({share})", "", ""))
    return rows


#: How the tables name a runtime's checkpoint.
_NAMES = {"runsc": "gVisor", "runc": "runc (CRIU)"}


def _starts_from_snapshot(backend: DockerBackend, session: DockerSession, rounds: int) -> list[float]:
    """Milliseconds to start (and serve) each of ``rounds`` sessions from one snapshot with processes."""
    snap = session.snapshot(processes=True)
    starts = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            child = backend.session(snapshot=snap)
            starts.append(_ms(started))
            child.close()
    finally:
        backend.remove_snapshot(snap)
    return starts


def measure_fleet(runtime: str, count: int) -> list[Row]:
    """``count`` idle sessions paused to disk together: what each costs the host, and that each resumes."""
    name = _NAMES[runtime]
    with DockerBackend(runtime=runtime, checkpoints=True) as backend:
        sessions = [backend.session() for _ in range(count)]
        try:
            for session in sessions:
                session.start()
            own_before = rss_kib()
            for session in sessions:
                session.pause()
            host = containers_rss_kib(session.container_id for session in sessions)
            disk = sum(_checkpoint_bytes(session) for session in sessions)
            own_growth = rss_kib() - own_before
            started = time.perf_counter()
            resumed = sum(session.execute(TRUE).exit_code == 0 for session in sessions)
            per_resume = _ms(started) / count
        finally:
            for session in sessions:
                session.close()
    return [
        Row(
            f"{name} on disk: {count} idle sessions paused together",
            f"host memory {host} KiB in all, checkpoints {disk / count / 2**20:.2f} MiB each, this "
            f"process +{own_growth} KiB",
            "",
            "",
            None,
            "≤ 1 MiB host memory and ≤ 4 MiB disk each",
            host <= 1024 * count and disk / count <= 4 * 2**20,
        ),
        Row(
            f"{name} on disk: each of the {count} resumed by a command",
            f"{resumed}/{count}, {per_resume:.0f} ms each",
            "",
            "",
            None,
            "each resumable",
            resumed == count,
        ),
    ]


def _check_alive(session: DockerSession) -> None:
    result = session.execute(
        ExecRequest(argv=("sh", "-c", "pgrep -f 'os.urandom' >/dev/null && echo up"), timeout=30)
    )
    assert result.stdout.strip() == "up", "the program holding the memory did not survive the pauses"


def measure_microvm(rounds: int) -> list[Row]:
    """The microVM (TCG) to disk by QEMU's migration, idle and holding 200 MB, and in place."""
    from adk_sandbox.executor.backends.microvm import MicroVMBackend, MicroVMConfig  # noqa: PLC0415

    config = MicroVMConfig(accel="tcg", limits=ResourceLimits(memory_mb=512), boot_timeout_seconds=120)
    rows: list[Row] = []
    with MicroVMBackend(config) as backend:
        boots = _boots(backend, 3)
        for held in (False, True):
            with backend.session() as session:
                if held:
                    ready = 'python3 -c "$HOLDER" >/dev/null 2>&1 &'
                    holder = HOLDER.replace("time.sleep", "open('/tmp/held', 'w').close(); time.sleep", 1)
                    session.execute(
                        ExecRequest(
                            argv=("sh", "-c", ready), env={"HOLDER": holder}, timeout=60, background=True
                        )
                    )
                    wait = ExecRequest(
                        argv=("sh", "-c", "while [ ! -e /tmp/held ]; do sleep 0.2; done"), timeout=300
                    )
                    session.execute(wait)
                what = "holding 200 MB" if held else "idle"
                cycles, in_place, sizes = _Cycles(), [], []

                def to_file(vm: Any = session, kept: list[int] = sizes) -> None:
                    vm.pause()
                    kept.append(os.stat(os.path.join(str(vm._run_dir), "machine.state")).st_size)

                for _ in range(rounds):
                    _cycle(cycles, session, to_file)
                    session.pause(keep_memory=True)
                    started = time.perf_counter()
                    session.resume()
                    in_place.append(_ms(started))
                forks, frozen = _forks(session, max(3, rounds // 4))
                starts = _snapshot_starts(backend, session, max(3, rounds // 4))
                pauses, resumes, firsts, plain = cycles.pauses, cycles.resumes, cycles.firsts, cycles.plain
                resume = Stats(tuple(resumes))
                rows += [
                    Row(
                        f"microVM (TCG) to disk: `resume()`, {what}",
                        f"p50 {resume.p50:.0f} / p99 {resume.p99:.0f} ms",
                        "",
                        "",
                        None,
                        "p50 ≤ 300 ms",
                        resume.p50 <= 300,
                    ),
                    Row.latency(
                        f"microVM to disk, {what}: the first command after `resume()`",
                        Stats(tuple(firsts)),
                        "a command of the same session, never paused",
                        Stats(tuple(plain)),
                    ),
                    Row(
                        f"microVM to disk: `pause()`, {what}; the machine's file",
                        f"p50 {Stats(tuple(pauses)).p50:.0f} ms; {max(sizes) / 2**20:.0f} MiB",
                        "",
                        "",
                    ),
                    Row(
                        f"microVM in place: `resume()` after `pause(keep_memory=True)`, {what}",
                        f"p50 {Stats(tuple(in_place)).p50:.1f} ms",
                        "",
                        "",
                    ),
                    _against_boot(f"microVM `fork(processes=True)`, {what}", forks, boots),
                    _against_boot(
                        f"microVM `fork(processes=True)` of it paused in place, {what}", frozen, boots
                    ),
                    _against_boot(f"microVM session from `snapshot(processes=True)`, {what}", starts, boots),
                ]
    return rows


def _against_boot(what: str, ours: Stats, boots: Stats) -> Row:
    """A copy's p50 until it answers a command, against a new session's boot, with the 300 ms target."""
    return Row(
        what,
        f"p50 {ours.p50:.0f} / p99 {ours.p99:.0f} ms",
        "a new session's boot",
        f"p50 {boots.p50:.0f} / p99 {boots.p99:.0f} ms",
        ours.p50 / boots.p50,
        "p50 ≤ 300 ms",
        ours.p50 <= 300,
    )


def _snapshot_starts(backend: Any, session: Any, rounds: int) -> Stats:
    """Sessions started from one ``snapshot(processes=True)`` of ``session``, until each answers a command."""
    from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

    store = SnapshotStore(tempfile.mkdtemp(prefix="adk-bench-snapshots-"))
    kept = session.snapshot(processes=True, store=store)
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        with backend.session(snapshot=kept) as copy:
            copy.execute(TRUE)
            took.append(_ms(started))
    store.remove(kept.id)
    shutil.rmtree(store.root, ignore_errors=True)
    return Stats(tuple(took))


def _boots(backend: Any, rounds: int) -> Stats:
    """Milliseconds to start a new session of ``backend`` (a boot), ``rounds`` times."""
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        with backend.session() as session:
            session.start()  # the context may have started it already: either way, timed from before
            took.append(_ms(started))
    return Stats(tuple(took))


def _forks(session: Any, rounds: int) -> tuple[Stats, Stats]:
    """``fork(processes=True)`` until the fork answers a command: of the running VM, then of it paused.

    Paused in place, the first fork migrates it and the others start from the same file.
    """
    running, frozen = [], []
    for kept in (running, frozen):
        if kept is frozen:
            session.pause(keep_memory=True)
        for _ in range(rounds):
            started = time.perf_counter()
            with session.fork(processes=True) as child:
                child.execute(TRUE)
                kept.append(_ms(started))
    session.resume()
    return Stats(tuple(running)), Stats(tuple(frozen))


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--runtimes", default="runc,runsc", help="comma-separated: runc, runsc")
    args.add_argument("--disk-runtimes", default="runsc,runc", help="checkpoints to disk: runsc, runc")
    args.add_argument("--no-disk", action="store_true", help="skip the checkpoint to disk")
    args.add_argument("--no-microvm", action="store_true", help="skip the microVM (QEMU, TCG)")
    options = args.parse_args()
    rounds = 10 if options.quick else 50
    rows: list[Row] = []
    for runtime in filter(None, options.runtimes.split(",")):
        rows += measure(None if runtime == "runc" else runtime, rounds)
    print_section("Pause and resume in place (issue 36)", rows, ["ratio: our p50 / the anchor's p50"])
    for runtime in [] if options.no_disk else filter(None, options.disk_runtimes.split(",")):
        disk = measure_disk(runtime, 5 if options.quick else 20)
        disk += measure_fleet(runtime, 5 if options.quick else 20)
        print_section(
            f"Pause to disk and resume, {_NAMES[runtime]} (issue 36)",
            disk,
            ["ratio: our p50 / the anchor's p50"],
        )
    if not options.no_microvm:
        vm = measure_microvm(5 if options.quick else 20)
        print_section("Pause, the microVM (issue 36)", vm, ["ratio: our p50 / the anchor's p50"])


if __name__ == "__main__":
    main()
