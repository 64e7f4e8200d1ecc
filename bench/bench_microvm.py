"""MicroVMBackend against a Docker session on the agent channel, side by side in one run.

* session start to the first command's result (p50): a microVM boot (TCG here) against a Docker container;
* a warm ``true`` (p50) over the open channel: the microVM's virtio-serial port against the Docker agent,
  and the microVM with ``guest_aslr="on"`` (how it was before ``"auto"`` turned it off under TCG);
* pool acquire (p50): ``session()`` from a pool of one whose member is ready (the wait for the refill's
  boot is not counted), and acquire + the first ``true``, against Docker's warm pool.

Run: ``.venv/bin/python bench/bench_microvm.py [--repeat N] [--commands N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from adk_sandbox.executor import ExecRequest, ResourceLimits
from adk_sandbox.executor.backend import SandboxSession
from adk_sandbox.executor.backends.docker import DockerBackend
from adk_sandbox.executor.backends.microvm import MicroVMBackend, MicroVMConfig, MicroVMSession

TRUE = ExecRequest(argv=("true",), timeout=60)


def _start_to_first(open_session: Callable[[], SandboxSession], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        with open_session() as session:
            assert session.execute(TRUE).exit_code == 0
            times.append(time.perf_counter() - started)
    return times


def _warm(session: SandboxSession, commands: int) -> list[float]:
    session.execute(TRUE)
    times = []
    for _ in range(commands):
        started = time.perf_counter()
        session.execute(TRUE)
        times.append(time.perf_counter() - started)
    return times


def _acquire(backend: MicroVMBackend | DockerBackend, repeat: int) -> tuple[list[float], list[float]]:
    """Acquire times and acquire + first ``true`` times, each from a pool whose member is ready."""
    pool = backend.pool
    assert pool is not None
    acquired, first = [], []
    for _ in range(repeat):
        assert pool.wait_ready(600)
        started = time.perf_counter()
        session = backend.session()
        acquired.append(time.perf_counter() - started)
        with session:
            assert session.execute(TRUE).exit_code == 0
            first.append(time.perf_counter() - started)
    return acquired, first


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def main() -> None:
    """Print the two tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--commands", type=int, default=50)
    args = parser.parse_args()
    limits = ResourceLimits(memory_mb=256, cpus=1, pids=256)
    with (
        MicroVMBackend(MicroVMConfig(accel="tcg", limits=limits)) as vm,
        DockerBackend(limits=limits) as docker,
    ):
        vm_start = _start_to_first(vm.session, args.repeat)
        docker_start = _start_to_first(docker.session, args.repeat)
        aslr = MicroVMSession(vm.config.model_copy(update={"guest_aslr": "on"}))
        with vm.session() as vm_session, docker.session() as docker_session, aslr:
            vm_warm, docker_warm, aslr_warm = [], [], []
            for _ in range(5):  # interleaved: the machine's load changes meanwhile
                vm_warm += _warm(vm_session, args.commands // 5)
                aslr_warm += _warm(aslr, args.commands // 5)
                docker_warm += _warm(docker_session, args.commands // 5)
            accel = vm_session.capabilities().accel
    with (
        MicroVMBackend(MicroVMConfig(accel="tcg", limits=limits), pool=1) as vm,
        DockerBackend(limits=limits, pool=1) as docker,
    ):
        vm_acquire, vm_acquire_first = _acquire(vm, args.repeat)
        docker_acquire, docker_acquire_first = _acquire(docker, args.repeat)
    print(f"load average {os.getloadavg()[0]:.2f}; microVM accel {accel}")
    print()
    print("| what | microVM | Docker (runc, agent channel) | ratio |")
    print("|---|---|---|---|")
    ratio = statistics.median(vm_start) / statistics.median(docker_start)
    what = f"session start + first `true` (p50 of {args.repeat})"
    print(f"| {what} | {_ms(vm_start)} | {_ms(docker_start)} | {ratio:.1f}x |")
    ratio = statistics.median(vm_warm) / statistics.median(docker_warm)
    print(f"| warm `true` (p50 of {args.commands}) | {_ms(vm_warm)} | {_ms(docker_warm)} | {ratio:.1f}x |")
    ratio = statistics.median(aslr_warm) / statistics.median(docker_warm)
    what = f"warm `true`, guest ASLR on (p50 of {args.commands})"
    print(f"| {what} | {_ms(aslr_warm)} | {_ms(docker_warm)} | {ratio:.1f}x |")
    for what, mine, theirs in (
        (f"pool acquire (p50 of {args.repeat})", vm_acquire, docker_acquire),
        (f"pool acquire + first `true` (p50 of {args.repeat})", vm_acquire_first, docker_acquire_first),
    ):
        ratio = statistics.median(mine) / statistics.median(theirs)
        print(f"| {what} | {_ms(mine)} | {_ms(theirs)} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
