"""The connection log: bounded, oldest dropped and counted, safe from many threads at once."""

from __future__ import annotations

import threading

import pytest

from adk_sandbox.executor.network.log import ConnectionEntry, ConnectionLog


def entry(i: int) -> ConnectionEntry:
    return ConnectionEntry(time=float(i), host=f"h{i}.test", port=443, decision="allowed", rule="allow *")


def test_the_log_keeps_the_newest_and_counts_the_dropped() -> None:
    log = ConnectionLog(max_entries=3)
    for i in range(5):
        log.record(entry(i))
    snapshot = log.snapshot()
    assert [e.host for e in snapshot.entries] == ["h2.test", "h3.test", "h4.test"]
    assert snapshot.dropped == log.dropped == 2
    assert log.entries() == snapshot.entries
    assert log.max_entries == 3


def test_a_log_must_hold_something() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLog(max_entries=0)


def test_many_threads_lose_no_count() -> None:
    log = ConnectionLog(max_entries=100)

    def write(base: int) -> None:
        for i in range(1000):
            log.record(entry(base + i))

    threads = [threading.Thread(target=write, args=(n * 1000,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshot = log.snapshot()
    assert len(snapshot.entries) == 100
    assert snapshot.dropped == 8000 - 100
