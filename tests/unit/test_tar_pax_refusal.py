"""Archives the sandbox writes are read only when they hold no pax header (tarstream.read_gnu_archive).

The library asks the sandbox's ``tar`` for GNU format, which never writes a pax extended header; a root
process in the sandbox can replace ``tar`` and send one. Python's ``tarfile`` (before 3.11.10 / 3.12.6,
CVE-2024-6232) parses a pax header with regular expressions quadratic in a run of digits: 40,000 digits
took 0.87 s here and 400,000 would take about 90 s, holding the GIL for every session. Such an archive is
refused unparsed, in the mirror's pull-back and in a snapshot's restore, while real GNU archives (long
names, sparse members with extension blocks) still read.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from adk_sandbox.executor.backends.docker._snapshot import _archive_pieces
from adk_sandbox.executor.workspace.tarstream import pax_header_offset, read_gnu_archive
from tests.unit.test_mirror_pullback_caps import (  # noqa: F401 - host: the fixture
    KEPT,
    archive,
    host,
    listing,
    plain_member,
    started,
    tree_of,
)

#: A pax header whose digits make tarfile's parser quadratic (a few minutes of CPU on a vulnerable Python).
DIGITS = 2_000_000


def pax_member(payload: bytes) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(payload)
    return info.tobuf(tarfile.GNU_FORMAT) + payload + bytes(-len(payload) % 512)


HOSTILE = pax_member(b"9" * DIGITS + b"\n")


def gnu_tar_of(root: Path) -> bytes:
    """What the sandbox's ``tar --format=gnu --sparse`` writes (the host's GNU tar here)."""
    argv = ["tar", "-c", "-f", "-", "--format=gnu", "--sparse", "-C", str(root), "."]
    return subprocess.run(argv, check=True, capture_output=True).stdout


@pytest.fixture
def real_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    (root / ("long-name-" * 20)).write_bytes(b"a long name: a GNU 'L' member\n")
    with open(root / "holes", "wb") as holes:  # ten extents: the old GNU map goes on in extension blocks
        for index in range(10):
            holes.seek(index * 1024 * 1024)
            holes.write(b"data %d\n" % index)
    return root


def test_real_gnu_archives_hold_no_pax_header_and_read(real_tree: Path) -> None:
    data = gnu_tar_of(real_tree)
    assert pax_header_offset(io.BytesIO(data)) is None
    with read_gnu_archive(io.BytesIO(data)) as files:
        names = {member.name.removeprefix("./") for member in files}
    assert {"holes", "long-name-" * 20} <= names


def test_a_pax_header_after_real_members_is_found_where_it_is(real_tree: Path) -> None:
    data = gnu_tar_of(real_tree)
    with read_gnu_archive(io.BytesIO(data)) as files:
        end = files.offset  # the end blocks start here
    stream = io.BytesIO(data[:end] + HOSTILE + data[end:])
    stream.seek(0)
    assert pax_header_offset(stream) == end
    assert stream.tell() == 0  # the position is kept


def test_a_hostile_pax_header_is_refused_unparsed_in_time() -> None:
    stream = io.BytesIO(HOSTILE + plain_member("f", b"x") + bytes(1024))
    started = time.monotonic()
    with pytest.raises(tarfile.ReadError, match="pax"):
        read_gnu_archive(stream)
    assert time.monotonic() - started < 10  # does not hang (tarfile: minutes on this Python)


def test_the_pull_back_refuses_such_an_archive_and_writes_nothing(host: Path) -> None:  # noqa: F811
    mirror, sandbox = started(host, 1)
    before = tree_of(host)
    sandbox.listing = listing(KEPT, touched=("f.txt",))
    sandbox.archive = archive(HOSTILE, plain_member("f.txt", b"two\n"))
    began = time.monotonic()
    refused = mirror.after_command(sandbox.run)
    assert time.monotonic() - began < 10
    assert refused == ["the changed files could not be read back from the sandbox (no GNU tar archive)"]
    assert tree_of(host) == before


def test_a_snapshots_archive_with_one_goes_whole_unparsed(tmp_path: Path) -> None:
    """A snapshot's restore cuts a sandbox's archive at its members; one holding a pax header is not read
    here but goes whole back into the new sandbox, for its own tar to judge (as an unreadable one did)."""
    path = tmp_path / "archive.tar"
    data = HOSTILE + plain_member("f", b"x") + bytes(1024)
    path.write_bytes(data)
    began = time.monotonic()
    pieces = list(_archive_pieces(os.open(path, os.O_RDONLY)))
    assert time.monotonic() - began < 10
    assert pieces == [data]
