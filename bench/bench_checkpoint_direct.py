"""A runtime's checkpoint and restore through Docker's API, against the runtime run directly on a directory.

Issue 36's target is resume and fork with processes at p50 <= 300 ms with 200 MB of process memory. Through
Docker the runtime's own restore is about a seventh of a resume: Docker tars each checkpoint into
containerd's content store and containerd unpacks it again (BENCHMARKS.md, "Where a resume's time goes").
This measures what a path beside Docker's would give: the same program (the base image, a program holding
``--mb`` MiB of random bytes) as a Docker container on ``--runtime`` (runc or runsc), checkpointed and
started from the checkpoint through the library's :class:`ContainerCheckpoints` (the engine's calls
alone), and as a container of the runtime's own (a bundle of the same image's files), checkpointed to a
directory and restored from it; on runc also lazily (CRIU's ``lazy-pages``: pages copied in on first touch,
through userfaultfd). Rounds alternate; each call is timed until it returns (the restored program then
answers, untimed). Needs root, and CRIU for runc.

Run: .venv/bin/python bench/bench_checkpoint_direct.py [--runtime runc|runsc] [--rounds N] [--mb M]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_checkpoint_engines import HOLD, _Subject

from adk_sandbox.executor.backends.docker import BASE_IMAGE
from adk_sandbox.executor.backends.docker._daemon import connect


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000


class _Directly:
    """The program as a container of the runtime's own (a bundle from the image), checkpointed to a directory.

    runc and runsc take the same arguments here (runsc ignores ``--work-path``); runsc restores into a
    container created first, under the same name.
    """

    def __init__(self, runtime: str, client: Any, mb: int, root: Path) -> None:
        self.runtime, self.root, self.id = runtime, root, f"adk-sandbox-bench-{root.name}"
        runsc = ["runsc", "--root", str(root / "state"), "--network=none"]  # what Docker's registration gives
        self.command = ["runc"] if runtime == "runc" else runsc
        self.bundle = root / "bundle"
        rootfs = self.bundle / "rootfs"
        rootfs.mkdir(parents=True)
        made = client.containers.create(BASE_IMAGE, ["true"])
        try:
            with tempfile.NamedTemporaryFile(suffix=".tar") as exported:
                for chunk in made.export():
                    exported.write(chunk)
                exported.flush()
                subprocess.run(["tar", "-x", "-f", exported.name, "-C", str(rootfs)], check=True)
        finally:
            made.remove(force=True)
        subprocess.run(["runc", "spec", "--bundle", str(self.bundle)], check=True)
        config_path = self.bundle / "config.json"
        config = json.loads(config_path.read_text())
        config["process"].update(terminal=False, args=["python3", "-c", HOLD.format(mb=mb)])
        config["root"]["readonly"] = False
        config_path.write_text(json.dumps(config))
        self.pauses: list[float] = []
        self.resumes: list[float] = []
        self.lazy_resumes: list[float] = []
        self._run("run", "--detach", "--bundle", str(self.bundle), self.id)
        self._ready()

    def _run(self, *argv: str, check: bool = True) -> None:
        # No pipes: a started or restored container inherits them, and reading them would never end.
        quiet = subprocess.DEVNULL
        subprocess.run([*self.command, *argv], check=check, stdin=quiet, stdout=quiet, stderr=quiet)

    def _ready(self) -> None:
        deadline = time.monotonic() + 120
        ready = [*self.command, "exec", self.id, "test", "-e", "/tmp/ready"]
        while subprocess.run(ready, check=False, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the program did not get ready")
            time.sleep(0.05)

    def round(self, *, lazy: bool) -> None:
        images, work = self.root / "images", self.root / "work"
        for directory in (images, work):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
        paths = ("--image-path", str(images), "--work-path", str(work))
        started = time.monotonic()
        self._run("checkpoint", *paths, self.id)
        self.pauses.append(_ms(started))
        if self.runtime != "runc":
            self._run("delete", "--force", self.id)  # the stopped container: its name is restored into
        server = None
        if lazy:  # CRIU's page server for the restored process's first touches, from the images
            argv = ["criu", "lazy-pages", "--images-dir", str(images), "--work-dir", str(work)]
            server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            socket = work / "lazy-pages.socket"
            while not socket.exists():
                time.sleep(0.01)
        started = time.monotonic()
        if self.runtime != "runc":
            self._run("create", "--bundle", str(self.bundle), self.id)
        restore = ["restore", "--detach", *paths, "--bundle", str(self.bundle)]
        self._run(*restore, *(["--lazy-pages"] if lazy else []), self.id)
        (self.lazy_resumes if lazy else self.resumes).append(_ms(started))
        self._ready()  # the same program, its file in the restored memory
        if server is not None:
            server.wait(timeout=120)  # it ends once every page is in

    def close(self) -> None:
        self._run("delete", "--force", self.id, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    """Alternate the paths round by round; print each figure's median and its ratio to Docker's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    args = parser.parse_args()
    client = connect()
    docker_path: _Subject | None = None
    direct: _Directly | None = None
    try:
        docker_path = _Subject("Docker", client, args.mb, runtime=args.runtime)
        scratch = Path(tempfile.mkdtemp(prefix="direct-", dir="/var/tmp"))
        direct = _Directly(args.runtime, client, args.mb, scratch)
        for index in range(args.rounds):
            steps = [docker_path.round, lambda: direct.round(lazy=False)]
            if args.runtime == "runc":  # CRIU's lazy restore; runsc has none through its restore command
                steps.append(lambda: direct.round(lazy=True))
            for step in steps if index % 2 == 0 else reversed(steps):
                step()
        what = f"{args.runtime}, a program holding {args.mb} MiB"
        print(f"{what}; medians of {args.rounds} rounds, alternated\n")
        print(f"| call | through Docker | {args.runtime} directly | ratio | target |\n|---|---|---|---|---|")
        docker_pause, docker_resume = (
            statistics.median(docker_path.pauses),
            statistics.median(docker_path.resumes),
        )
        rows = [
            ("checkpoint (stopped)", statistics.median(direct.pauses), docker_pause),
            ("restore (started)", statistics.median(direct.resumes), docker_resume),
        ]
        if direct.lazy_resumes:  # runc's only
            rows.append(
                ("the same, lazily (CRIU lazy-pages)", statistics.median(direct.lazy_resumes), docker_resume)
            )
        for what, ours, theirs in rows:
            target = (
                ""
                if what.startswith("checkpoint")
                else f"p50 ≤ 300 ms: {'met' if ours <= 300 else 'not met'}"
            )
            print(f"| {what} | {theirs:.0f} ms | {ours:.0f} ms | {ours / theirs:.2f}x | {target} |")
    finally:
        if docker_path is not None:
            docker_path.close()
        if direct is not None:
            direct.close()
        client.close()


if __name__ == "__main__":
    main()
