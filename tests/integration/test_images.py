"""The sandbox images against the real engine: present and current after setup, rebuilt only when their
context changes, and usable the way the Docker backend runs them (read-only root, uid 1000, no network,
no capabilities).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from adk_sandbox.executor import __version__
from adk_sandbox.executor.backends.docker import images
from tests.conftest import require

TEST_LABEL = "io.adk-sandbox.test"

HARDENED: dict[str, Any] = {
    "read_only": True,
    "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,size=256m", "/home/sandbox": "rw,exec,nosuid,nodev,size=16m"},
    "user": "1000:1000",
    "network_mode": "none",
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "labels": {TEST_LABEL: "images"},
}


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    try:
        engine = docker.from_env(timeout=120)
        engine.ping()
    except Exception as exc:
        require(False, f"no Docker engine answers ({exc}); scripts/setup starts one as root on Debian")
        raise
    yield engine
    engine.close()


def run_hardened(client: Any, image: str, script: str) -> str:
    """Run ``script`` with bash under the backend's hardening; its stdout+stderr (fails on non-zero exit)."""
    name = f"adk-sandbox-test-images-{uuid.uuid4().hex[:12]}"
    try:
        out = client.containers.run(image, ["bash", "-c", script], name=name, stderr=True, **HARDENED)
    except docker.errors.ContainerError as exc:
        pytest.fail(f"{image} failed (exit {exc.exit_status}): {exc.stderr!r}")
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)
    return bytes(out).decode()


def test_images_exist_and_are_current_after_setup(client: Any) -> None:
    statuses = {s.name: s for s in images.check_images()}
    assert set(statuses) == {"base", "rust"}
    for status in statuses.values():
        assert status.state == "current", f"{status.tag}: {status.state} ({status.detail})"
    for tag in (images.BASE_IMAGE, images.RUST_IMAGE):
        latest = client.images.get(tag)
        versioned = client.images.get(tag.replace(":latest", f":{__version__}"))
        assert latest.id == versioned.id
        assert latest.labels[images.CONTEXT_HASH_LABEL]
    rust = client.images.get(images.RUST_IMAGE)
    assert rust.labels[images.BASE_IMAGE_LABEL] == images.BASE_IMAGE


def test_images_build_is_a_noop_when_current(client: Any) -> None:
    before = {tag: client.images.get(tag).id for tag in (images.BASE_IMAGE, images.RUST_IMAGE)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "adk_sandbox", "images", "build"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "adk-sandbox/base:latest is up to date" in done.stdout
    assert "adk-sandbox/rust:latest is up to date" in done.stdout
    assert "all images up to date" in done.stdout
    assert "Step " not in done.stdout, "something was rebuilt"
    after = {tag: client.images.get(tag).id for tag in before}
    assert after == before
    assert elapsed < 15, f"a no-op images build took {elapsed:.1f} s"


def test_images_build_help_and_a_bad_base_image_fail_in_one_line() -> None:
    help_ = subprocess.run(
        [sys.executable, "-m", "adk_sandbox", "images", "build", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_.returncode == 0
    assert "--base-image" in help_.stdout and "--force" in help_.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "adk_sandbox",
            "images",
            "build",
            "--base-image",
            "adk-sandbox-test/absent:nope",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0
    errors = bad.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("adk-sandbox: error:"), bad.stderr
    assert "adk-sandbox-test/absent:nope" in errors[0]


def test_rust_image_compiles_and_runs_a_serde_json_program_hardened(client: Any) -> None:
    script = r"""
set -eu
cd /tmp
cat > main.rs <<'RS'
use serde_json::Value;
use std::io::Read;
fn main() {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).unwrap();
    let input: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let n = input["n"].as_i64().unwrap_or(0);
    println!("{}", serde_json::json!({"n": n + 1, "who": "rust"}));
}
RS
rustc --edition 2021 -L dependency=/opt/rust-deps \
    --extern serde_json=/opt/rust-deps/libserde_json.rlib -o /tmp/main main.rs
echo '{"n": 41}' | /tmp/main
id -u
"""
    out = run_hardened(client, images.RUST_IMAGE, script)
    lines = out.strip().splitlines()
    assert lines[-2] == '{"n":42,"who":"rust"}', out
    assert lines[-1] == "1000"


def test_rust_deps_directory_is_fixed_and_complete(client: Any) -> None:
    out = run_hardened(client, images.RUST_IMAGE, "ls /opt/rust-deps; rustc --version; cargo --version")
    names = out.split()
    assert "libserde_json.rlib" in names
    for crate in ("serde", "itoa", "ryu", "memchr"):
        assert any(n.startswith(f"lib{crate}-") and n.endswith(".rlib") for n in names), (crate, names)


def test_base_image_has_the_promised_tools_and_runs_read_only_as_uid_1000(client: Any) -> None:
    script = r"""
set -u
for tool in bash sh git python3 ps setsid grep sed find xargs less file diff patch xz tar; do
    command -v "$tool" >/dev/null || echo "MISSING $tool"
done
echo "uid=$(id -u) gid=$(id -g) home=$HOME"
touch /etc/adk-probe 2>/dev/null && echo "ROOT WRITABLE" || echo "root read-only"
touch /tmp/probe && echo "tmp writable"
touch "$HOME/probe" && echo "home writable"
setsid sh -c 'ps -o pid= -p $$' >/dev/null && echo "setsid+ps ok"
python3 -c 'print("python", 6 * 7)'
git --version >/dev/null && echo "git ok"
"""
    out = run_hardened(client, images.BASE_IMAGE, script)
    assert "MISSING" not in out, out
    assert "uid=1000 gid=1000 home=/home/sandbox" in out
    assert "root read-only" in out and "ROOT WRITABLE" not in out
    for expected in ("tmp writable", "home writable", "setsid+ps ok", "python 42", "git ok"):
        assert expected in out, out


def write_context(root: Path, base_body: str, rust_body: str) -> None:
    for name, body in (("base", base_body), ("rust", rust_body)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "Dockerfile").write_text(f"ARG BASE_IMAGE=none\nFROM ${{BASE_IMAGE}}\n{body}\n")


def test_build_images_rebuilds_exactly_what_changed(client: Any, tmp_path: Path) -> None:
    """Small stand-in contexts under a test tag prefix: the skip/rebuild/cascade logic, in seconds."""
    prefix = f"adk-sandbox-test-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "images"
    write_context(root, "RUN echo one > /marker", "LABEL step=one")
    log: list[str] = []
    try:
        first = images.build_images(
            base_image=images.BASE_IMAGE, root=root, tag_prefix=prefix, progress=log.append
        )
        assert [(r.name, r.action) for r in first] == [("base", "built"), ("rust", "built")]
        assert any("Step " in line for line in log)

        again = images.build_images(base_image=images.BASE_IMAGE, root=root, tag_prefix=prefix)
        assert [(r.name, r.action) for r in again] == [("base", "up to date"), ("rust", "up to date")]
        assert [r.image_id for r in again] == [r.image_id for r in first]

        (root / "rust" / "extra.txt").write_text("a file in the rust context\n")
        rust_only = images.build_images(base_image=images.BASE_IMAGE, root=root, tag_prefix=prefix)
        assert [(r.name, r.action) for r in rust_only] == [("base", "up to date"), ("rust", "built")]

        write_context(root, "RUN echo two > /marker", "LABEL step=one")
        cascade = images.build_images(base_image=images.BASE_IMAGE, root=root, tag_prefix=prefix)
        assert [(r.name, r.action) for r in cascade] == [("base", "built"), ("rust", "built")]
        assert client.images.get(f"{prefix}/rust:{__version__}").id == cascade[1].image_id

        # The failing step comes right after FROM, so the failed build leaves no intermediate image behind.
        write_context(root, "RUN echo two > /marker", "RUN echo 'broken step output' && exit 3")
        with pytest.raises(images.ImageBuildError) as failure:
            images.build_images(base_image=images.BASE_IMAGE, root=root, tag_prefix=prefix)
        assert f"{prefix}/rust:latest" in str(failure.value)
        assert "\n" not in str(failure.value)
        assert "broken step output" in failure.value.output
    finally:
        for name in ("rust", "base"):  # children first
            for tag in ("latest", __version__):
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(f"{prefix}/{name}:{tag}")
    assert not client.images.list(name=f"{prefix}/*")


@pytest.mark.slow
def test_without_a_registry_the_debian_base_is_bootstrapped(client: Any, tmp_path: Path) -> None:
    """The air-gapped path end to end: no base image given, none present -> debootstrap + docker import."""
    require(os.geteuid() == 0, "bootstrapping with debootstrap needs root")
    prefix = f"adk-sandbox-test-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "images"
    write_context(root, "RUN test -f /etc/debian_version && grep -q trixie /etc/os-release", "LABEL ok=1")
    (root / "bootstrap").mkdir()
    shutil.copy(images.images_dir() / "bootstrap" / "bootstrap.sh", root / "bootstrap" / "bootstrap.sh")
    log: list[str] = []
    try:
        results = images.build_images(root=root, tag_prefix=prefix, progress=log.append)
        assert [(r.name, r.action) for r in results] == [("base", "built"), ("rust", "built")]
        if results[0].built_on != images.REGISTRY_BASE_IMAGE:  # a machine with a registry pulls instead
            assert results[0].built_on == f"{prefix}/debian:trixie"
            assert any(line.startswith("bootstrap: ") for line in log)
            again = images.build_images(root=root, tag_prefix=prefix)
            assert [r.action for r in again] == ["up to date", "up to date"]
    finally:
        for ref in (
            *(f"{prefix}/{n}:{t}" for n in ("rust", "base") for t in ("latest", __version__)),
            f"{prefix}/debian:trixie",
        ):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(ref)
    assert not client.images.list(name=f"{prefix}/*")
