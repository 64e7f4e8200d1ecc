"""User names: ``"root"``, ``"app:app"``, ``"1000:staff"`` to numbers, from a passwd and a group file.

A request's ``user`` may name users and groups wherever it may give numbers (:func:`.types.check_user`).
A sandbox looks them up in its own ``/etc/passwd`` and ``/etc/group`` (read inside it, as they are when the
command starts: a user made by ``adduser`` a moment ago is found), a host backend in the host's.
"""

from __future__ import annotations

import grp
import pwd

from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.types import is_numeric_user as is_numeric
from adk_sandbox.executor.types import parse_user

__all__ = ["host_user", "is_numeric", "resolve_user"]


def _table(text: str) -> dict[str, tuple[int, int]]:
    """Name -> (id, primary gid) of a passwd file, or (gid, gid) of a group file; bad lines skipped."""
    table: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 4 or not fields[0]:
            continue
        try:
            number = int(fields[2])
            primary = int(fields[3]) if len(fields) >= 7 else number
        except ValueError:
            continue
        table.setdefault(fields[0], (number, primary))
    return table


def resolve_user(user: str, passwd: str, group: str, *, where: str = "the sandbox") -> tuple[int, int]:
    """``(uid, gid)`` of ``user`` given the text of a passwd and a group file.

    A name alone takes that user's primary group; ``"name:group"`` and ``"uid:group"`` look the group up
    too; a bare uid runs with the group of the same number (never group 0 by default). An unknown name
    is an :class:`InvalidRequestError` saying where it was looked for.
    """
    name, _, group_name = user.partition(":")
    users = _table(passwd)
    if name.isdigit():
        uid, primary = parse_user(name)[0], None
    elif name in users:
        uid, primary = users[name]
    else:
        raise InvalidRequestError(
            f"user {name!r} is not in {where}'s /etc/passwd; nothing ran. Give a uid, or a user that exists "
            "there (a command can add one first: adduser / useradd)"
        )
    if not group_name:
        return uid, primary if primary is not None else uid
    if group_name.isdigit():
        return uid, parse_user(group_name)[0]
    groups = _table(group)
    if group_name not in groups:
        raise InvalidRequestError(
            f"group {group_name!r} is not in {where}'s /etc/group; nothing ran. Give a gid, or a group "
            "that exists there"
        )
    return uid, groups[group_name][0]


def host_user(user: str) -> tuple[int, int | None]:
    """``(uid, gid or None)`` of ``user`` on this host (names from ``pwd`` and ``grp``)."""
    if is_numeric(user):
        return parse_user(user)
    name, _, group_name = user.partition(":")
    if name.isdigit():
        uid, gid = parse_user(name)[0], None
    else:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise InvalidRequestError(f"user {name!r} is not a user of this host; nothing ran") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if not group_name:
        return uid, gid
    if group_name.isdigit():
        return uid, int(group_name)
    try:
        return uid, grp.getgrnam(group_name).gr_gid
    except KeyError:
        raise InvalidRequestError(f"group {group_name!r} is not a group of this host; nothing ran") from None
