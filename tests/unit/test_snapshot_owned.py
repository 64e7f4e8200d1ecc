"""Owned snapshots go when their owner exits by any path but SIGKILL (``executor/snapshots/owned.py``).

Each case is a real process that commits snapshots into a real store and then ends its own way; the test
looks at the store's directory afterwards. Before this, every one of them (SIGKILL's aside) left its
owned snapshot in place until a reaper ran: ``/dev/shm`` held it (769 MiB in the report that asked).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PRELUDE = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    # The endings are tried with each signal at its default, as an owner started from a terminal has it; a
    # test run under nohup hands SIGHUP down ignored, which the library rightly keeps.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from adk_sandbox.executor import _owner
    from adk_sandbox.executor.snapshots import Snapshot, SnapshotStore
    from adk_sandbox.executor.snapshots.store import new_id

    store = SnapshotStore(sys.argv[1])
    KEYS = (_owner.OWNER_PID, _owner.OWNER_START, _owner.OWNER_BOOT, _owner.OWNER_HOST, _owner.OWNER_PIDNS)

    def take(detached=False):
        owner = {} if detached else {k: v for k, v in _owner.owner_labels("snapshot", 0).items() if k in KEYS}
        snapshot_id = new_id()

        def build(partial):
            Path(partial, "workspace").mkdir()
            Path(partial, "workspace", "f.txt").write_text("data")
            now = time.time()
            return Snapshot(id=snapshot_id, name=snapshot_id, created=now, expires=int(now) + 3600,
                            owner=owner, image="adk-sandbox/base:latest", image_id="sha256:0",
                            profile="hardened", workspace="/work/repo")

        return store.take(snapshot_id, build, durable=detached)

    owned = take()
    detached = take(detached=True)
    print(owned.id, detached.id, flush=True)
    """
)


def _run(tmp_path: Path, ending: str) -> tuple[subprocess.CompletedProcess[str], set[str], str, str]:
    """Run the prelude, then ``ending``, in a child: its outcome, the store's entries, the two ids."""
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(ending), str(root)],
        check=False, capture_output=True, text=True, timeout=60,
        # As from a terminal: a test run started with SIGINT ignored (a shell's background job) hands it down.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    owned_id, detached_id = child.stdout.split()[:2]
    return child, set(os.listdir(root)), owned_id, detached_id


@pytest.mark.parametrize(
    ("ending", "returncode"),
    [
        pytest.param("", 0, id="normal-exit"),
        pytest.param("raise RuntimeError('the agent loop failed')", 1, id="uncaught-exception"),
        pytest.param("sys.exit(3)", 3, id="sys-exit"),
        pytest.param("os.kill(os.getpid(), signal.SIGINT); time.sleep(30)", -signal.SIGINT, id="ctrl-c"),
        pytest.param("os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)", -signal.SIGTERM, id="sigterm"),
        pytest.param("os.kill(os.getpid(), signal.SIGHUP); time.sleep(30)", -signal.SIGHUP, id="sighup"),
    ],
)
def test_an_owned_snapshot_is_removed_when_its_owner_ends(
    tmp_path: Path, ending: str, returncode: int
) -> None:
    """Every ending but SIGKILL removes the owned snapshot; a detached one stays; the exit status is kept."""
    child, left, owned_id, detached_id = _run(tmp_path, ending)
    assert child.returncode == returncode, child.stderr
    assert owned_id not in left
    assert detached_id in left
    assert not any(name.startswith((".partial", ".removing")) for name in left)


def test_sigkill_leaves_it_to_the_reaper(tmp_path: Path) -> None:
    child, left, owned_id, _ = _run(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    assert child.returncode == -signal.SIGKILL
    assert owned_id in left  # nothing runs after SIGKILL: the reaper's case (test_snapshot_store.py)


def test_an_applications_own_sigterm_handler_is_kept(tmp_path: Path) -> None:
    """A handler the application installed first is not replaced; its sys.exit still removes the snapshot."""
    ending = """
    print("handler kept:", signal.getsignal(signal.SIGTERM) is on_term, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    """
    prelude_hook = "def on_term(signum, frame):\n    sys.exit(7)\nsignal.signal(signal.SIGTERM, on_term)\n"
    root = tmp_path / "store"
    script = _PRELUDE.replace(
        "store = SnapshotStore", prelude_hook + "store = SnapshotStore"
    ) + textwrap.dedent(ending)
    child = subprocess.run(
        [sys.executable, "-c", script, str(root)], check=False, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 7, child.stderr
    owned_id = child.stdout.split()[0]
    assert "handler kept: True" in child.stdout
    assert owned_id not in os.listdir(root)


def test_a_forked_child_does_not_remove_its_parents_snapshots(tmp_path: Path) -> None:
    """A child made by os.fork runs the parent's atexit hooks; it must not take the parent's snapshots."""
    ending = """
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the child's atexit runs here
    os.waitpid(pid, 0)
    print("after child:", Path(owned.path).is_dir(), flush=True)
    """
    child, left, owned_id, _ = _run(tmp_path, ending)
    assert child.returncode == 0, child.stderr
    assert "after child: True" in child.stdout
    assert owned_id not in left  # the parent's own exit removed it
