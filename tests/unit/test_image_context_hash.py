"""The context hash decides whether an image is rebuilt: it must change exactly when the build would."""

from __future__ import annotations

from pathlib import Path

from adk_sandbox.executor.backends.docker.images import context_hash, image_specs, images_dir

ARGS = {"BASE_IMAGE": "adk-sandbox/debian:trixie"}
BASE_ID = "sha256:" + "a" * 64


def make_context(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY sub/ /x/\n")
    (root / "sub" / "file.txt").write_text("one\n")
    return root


def test_hash_is_stable_for_the_same_context(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    first = context_hash(ctx, ARGS, BASE_ID)
    assert first == context_hash(ctx, dict(ARGS), BASE_ID)
    assert len(first) == 64


def test_hash_changes_when_a_file_in_the_context_changes(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    before = context_hash(ctx, ARGS, BASE_ID)
    (ctx / "sub" / "file.txt").write_text("two\n")
    changed = context_hash(ctx, ARGS, BASE_ID)
    assert changed != before
    (ctx / "sub" / "file.txt").write_text("one\n")
    assert context_hash(ctx, ARGS, BASE_ID) == before


def test_hash_changes_with_the_dockerfile_a_new_file_a_rename_and_the_mode(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    seen = {context_hash(ctx, ARGS, BASE_ID)}
    (ctx / "Dockerfile").write_text((ctx / "Dockerfile").read_text() + "RUN true\n")
    seen.add(context_hash(ctx, ARGS, BASE_ID))
    (ctx / "new.sh").write_text("echo\n")
    seen.add(context_hash(ctx, ARGS, BASE_ID))
    (ctx / "new.sh").chmod(0o755)
    seen.add(context_hash(ctx, ARGS, BASE_ID))
    (ctx / "new.sh").rename(ctx / "renamed.sh")
    seen.add(context_hash(ctx, ARGS, BASE_ID))
    assert len(seen) == 5


def test_hash_depends_on_the_base_image_id_and_the_build_args(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    plain = context_hash(ctx, ARGS, BASE_ID)
    assert context_hash(ctx, ARGS, "sha256:" + "b" * 64) != plain
    assert context_hash(ctx, {"BASE_IMAGE": "debian:trixie-slim"}, BASE_ID) != plain


def test_hash_ignores_python_caches(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    before = context_hash(ctx, ARGS, BASE_ID)
    (ctx / "__pycache__").mkdir()
    (ctx / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert context_hash(ctx, ARGS, BASE_ID) == before


def test_the_project_images_are_found_in_build_order() -> None:
    specs = image_specs()
    assert [s.name for s in specs] == ["base", "rust"]
    assert [s.tag for s in specs] == ["adk-sandbox/base:latest", "adk-sandbox/rust:latest"]
    assert all((s.context / "Dockerfile").is_file() for s in specs)
    assert (images_dir() / "bootstrap" / "bootstrap.sh").is_file()
    for spec in specs:
        assert "ARG BASE_IMAGE=" in (spec.context / "Dockerfile").read_text()
