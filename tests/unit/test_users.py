"""User names looked up in a sandbox's passwd and group files (executor/_users.py)."""

from __future__ import annotations

import os
import pwd

import pytest

from adk_sandbox.executor._users import host_user, is_numeric, resolve_user
from adk_sandbox.executor.errors import InvalidRequestError

USER_TABLE = """root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
app:x:1000:1001::/home/app:/bin/sh
broken line
bad:x:notanumber:0::/:/bin/sh
app:x:2000:2000:a second entry is ignored, as getpwnam does:/:/bin/sh
"""
GROUP = """root:x:0:
staff:x:50:app
app:x:1001:
"""


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("root", (0, 0)),
        ("app", (1000, 1001)),  # the user's primary group
        ("app:staff", (1000, 50)),
        ("app:0", (1000, 0)),
        ("1000:staff", (1000, 50)),
        ("1234", (1234, 1234)),  # a bare uid: the group of the same number, never root's
        ("nobody", (65534, 65534)),
    ],
)
def test_names_resolve_from_the_tables(user: str, expected: tuple[int, int]) -> None:
    assert resolve_user(user, USER_TABLE, GROUP) == expected


@pytest.mark.parametrize(("user", "says"), [("ghost", "user 'ghost'"), ("app:ghosts", "group 'ghosts'"),
                                            ("bad", "user 'bad'"), ("x", "user 'x'")])  # fmt: skip
def test_unknown_names_are_refused_saying_which(user: str, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says) as info:
        resolve_user(user, USER_TABLE, GROUP, where="the box")
    assert "the box's /etc/" in str(info.value) and "nothing ran" in str(info.value)


def test_numbers_need_no_lookup() -> None:
    assert is_numeric("0") and is_numeric("1000:1000")
    assert not is_numeric("root") and not is_numeric("1000:staff")


def test_host_names_come_from_the_hosts_tables() -> None:
    me = pwd.getpwuid(os.geteuid())
    assert host_user(me.pw_name) == (me.pw_uid, me.pw_gid)
    assert host_user(f"{me.pw_uid}:{me.pw_gid}") == (me.pw_uid, me.pw_gid)
    with pytest.raises(InvalidRequestError, match="not a user of this host"):
        host_user("no-such-user-here")
