"""Tar members written and read without their holes, in archives one command's input can carry.

The workspace mirror's push, its pull-back and a snapshot's restore into a sandbox all speak GNU tar with
the sandbox's ``tar``; this module is the one place that writes such members (a file's holes never travel:
:func:`tar_file_member`), reads one's data in place (:func:`member_content`), and cuts a stream of members
into whole archives small enough for one command's input (:func:`archives`; the channel refuses more than
:data:`~adk_sandbox.executor.channel.transport.MAX_COMMAND_INPUT`, and the sandbox's agent would end it).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO, cast

from adk_sandbox.executor.channel.transport import MAX_COMMAND_INPUT
from adk_sandbox.executor.workspace.pullback import Content

__all__ = [
    "ARCHIVE_BYTES",
    "MAX_FILE_DATA",
    "archives",
    "member_content",
    "pax_header_offset",
    "read_gnu_archive",
    "tar_end",
    "tar_file_member",
    "tar_header",
]

#: About how many bytes one archive of :func:`archives` holds (cut between members): what a push or a
#: restore holds in memory at once, and far below what one command's input may carry.
ARCHIVE_BYTES = 64 * 1024 * 1024
#: The most data one file may hold to travel in one command's input (with its header, the map and the end
#: blocks in the rest); a larger one is refused by the caller, with its name.
MAX_FILE_DATA = MAX_COMMAND_INPUT - 1024 * 1024

#: How names and link targets are written in a tar (what ``tarfile`` does by default here).
_ENCODING = "utf-8"
_BLOCK = 512
#: The kinds of header a GNU-format archive never holds: pax extended headers (``x``, Solaris' ``X``, global
#: ``g``). Before Python 3.11.10 / 3.12.6 ``tarfile`` parses them with regular expressions that take
#: quadratic time on a long run of digits (CVE-2024-6232; 20 KB took a second), and whole seconds hold the
#: GIL for every session: the sandbox writes the archives read here, so one holding these is refused unread.
_PAX_KINDS = (b"x", b"X", b"g")
#: Where a PAX 1.0 sparse member's header puts its file: the real name is in ``GNU.sparse.name``.
_SPARSE_PLACEHOLDER = "GNUSparseFile.0/f"


def tar_header(info: tarfile.TarInfo) -> bytes:
    """The GNU header block(s) of a member without data (a directory, a link); names kept byte for byte."""
    return info.tobuf(tarfile.GNU_FORMAT, _ENCODING, "surrogateescape")


def tar_file_member(
    name: str, content: Content, *, mode: int, owner: tuple[int, int], mtime: int
) -> list[bytes | memoryview]:
    r"""The tar member of a regular file ``name`` holding ``content``: header blocks, data, padding.

    A file without holes is a plain GNU member. A sparse one is a PAX 1.0 sparse member, which GNU tar
    unpacks as a sparse file (Python's ``tarfile`` writes no sparse member, so it would write the holes
    out): a pax header with ``GNU.sparse.major=1``, ``GNU.sparse.minor=0``, ``GNU.sparse.name`` and
    ``GNU.sparse.realsize``; then the data block starts with the map ("count\noffset\nsize\n...", padded
    to 512 bytes) followed by the extents' data. A trailing hole ends the map with an empty extent at the
    file's size, as GNU tar writes it. The data is referenced, not copied.
    """
    info = tarfile.TarInfo(name)
    info.uid, info.gid = owner
    info.mode, info.mtime = mode, mtime
    data = [part for _, part in content.extents]
    if content.sparse:
        entries = [(offset, len(part)) for offset, part in content.extents]
        if not entries or entries[-1][0] + entries[-1][1] < content.size:
            entries.append((content.size, 0))
        table = (f"{len(entries)}\n" + "".join(f"{offset}\n{size}\n" for offset, size in entries)).encode()
        table += bytes(-len(table) % _BLOCK)
        info.name = _SPARSE_PLACEHOLDER
        info.size = len(table) + content.data_bytes
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": name,
            "GNU.sparse.realsize": str(content.size),
        }
        # A name that is not UTF-8 (a host name's surrogate escapes) goes as bytes (pax "hdrcharset=BINARY").
        header = info.tobuf(tarfile.PAX_FORMAT, _ENCODING, "surrogateescape")
        return [header, table, *data, bytes(-info.size % _BLOCK)]
    info.size = content.size
    return [tar_header(info), *data, bytes(-info.size % _BLOCK)]


def tar_end(parts: list[bytes | memoryview]) -> bytes:
    """The archive of the members ``parts``: joined, ended by two zero blocks, padded to a 10 KiB record."""
    size = sum(len(part) for part in parts) + 2 * _BLOCK
    return b"".join([*parts, bytes(2 * _BLOCK + (-size % tarfile.RECORDSIZE))])


def member_content(archive: bytes, member: tarfile.TarInfo) -> Content:
    """The content of the regular (maybe sparse) ``member`` of ``archive``, its data referenced in place.

    A sparse member (GNU or PAX, as ``tarfile`` reads its map) stores its extents one after the other from
    ``offset_data``; the holes are not in the archive and are not made here. An extent past the end of the
    archive (a cut one) raises ``tarfile.ReadError``.
    """
    view = memoryview(archive)
    extents: list[tuple[int, bytes | memoryview]] = []
    at = member.offset_data
    # tarfile keeps a sparse member's map as (offset, size) pairs (its stubs call it bytes).
    sparse = cast("list[tuple[int, int]] | None", member.sparse)
    pieces = [(0, member.size)] if sparse is None else sparse
    for offset, length in pieces:
        if length <= 0:
            continue
        if at + length > len(archive) or offset + length > member.size:
            raise tarfile.ReadError("a member's data goes past the archive or its size")
        extents.append((offset, view[at : at + length]))
        at += length
    return Content(member.size, tuple(extents))


def archives(members: Iterable[list[bytes | memoryview]], limit: int = ARCHIVE_BYTES) -> Iterator[bytes]:
    """The ``members`` (each a list of parts: header, data, padding) as whole archives.

    Each holds about ``limit`` bytes, cut between members (one larger member is an archive of its own).
    """
    parts: list[bytes | memoryview] = []
    held = 0
    for member in members:
        size = sum(len(part) for part in member)
        if held and held + size > limit:
            yield tar_end(parts)
            parts, held = [], 0
        parts += member
        held += size
    if parts:
        yield tar_end(parts)


def read_gnu_archive(stream: BinaryIO) -> tarfile.TarFile:
    """``tarfile.open`` of a GNU-format archive a sandbox wrote (the caller closes it).

    One holding a pax header was forged: refused unparsed (``tarfile.ReadError``, :func:`pax_header_offset`).
    """
    if pax_header_offset(stream) is not None:
        raise tarfile.ReadError("a pax extended header, which a GNU-format archive never holds")
    return tarfile.open(fileobj=stream, mode="r:")


def pax_header_offset(stream: BinaryIO) -> int | None:
    """Where the first pax extended header of the tar archive in ``stream`` is (from its position), or None.

    The library's archives are GNU format (``tar --format=gnu``), which writes none: one found was forged,
    and is refused before ``tarfile`` parses it (:data:`_PAX_KINDS`). Linear: only header blocks are read
    (an old GNU sparse member's map blocks too), the data is skipped by seeking. A header that does not read
    ends the walk (``tarfile`` then judges the archive). The stream's position is restored.
    """
    start = stream.tell()
    offset = start
    try:
        while True:
            stream.seek(offset)
            header = stream.read(_BLOCK)
            if len(header) < _BLOCK or header.count(0) == _BLOCK:
                return None
            if header[156:157] in _PAX_KINDS:
                return offset - start
            size = _header_number(header[124:136])
            if size is None:
                return None
            offset += _BLOCK
            if header[156:157] == tarfile.GNUTYPE_SPARSE and header[482]:  # its map goes on in more blocks
                while True:
                    stream.seek(offset)
                    extension = stream.read(_BLOCK)
                    offset += _BLOCK
                    if len(extension) < _BLOCK or not extension[504]:
                        break
            offset += -(-size // _BLOCK) * _BLOCK
    finally:
        stream.seek(start)


def _header_number(field: bytes) -> int | None:
    """A tar header's number field (octal, or GNU's base-256 when its first bit is set); None if it is not."""
    if field[0] & 0x80:
        return None if field[0] == 0xFF else int.from_bytes(field[1:], "big")  # 0xff: negative
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        return None
