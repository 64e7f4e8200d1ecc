"""The Python program that runs inside a sandbox, as the host ships it: the exec transport's supervisor.

The supervisor (``inside/supervisor.py``, :mod:`.supervisor`) and its prelude (``inside/setid_filter.py``
and ``inside/prelude.py``) are real files under ``inside/`` (package data, read with
:mod:`importlib.resources`). They travel as a ``python3 -I -S -c`` argument, so they cannot import anything
of this package inside the sandbox. The prelude is spliced into the program at the line ``# @PRELUDE@`` by
:func:`in_container_program` (the agent is C: :mod:`.static_agent`):

* the set-id seccomp filter (:mod:`.setid`): ``install_setid_filter`` (``inside/setid_filter.py``) and
  ``SETID``, the program for this machine's architecture (``None`` where there is none: commands then refuse
  to start);
* the process tools (``inside/prelude.py``): reading ``/proc`` (``stat_of``, ``scan``: ppid, session, start
  time, state), ``send`` (a signal through a pidfd after re-checking the start time, so a reused pid is
  never hit), ``below`` (descendants by ppid), ``kill_all`` (SIGSTOP then SIGKILL in passes until nothing
  is left, so a fork bomb cannot refill what a kill frees), ``reap_any``, ``argv_of``, ``marker_of`` and
  ``parse_protected``.

Requirements of a program using it: ``os``, ``signal`` and ``time`` imported, and the globals ``SELF``
(its own pid, never signalled) and ``MARK`` (``b"ADK_SANDBOX_EXEC="``) defined. Kept compatible with
Python >= 3.6, standard library only.

The files are checked on the host like any module (ruff, ``mypy --strict``): their annotations are strings,
never evaluated inside the sandbox. Lines between ``# @CHECK-ONLY@`` and ``# @END-CHECK-ONLY@`` (the
imports and declarations only the checkers need) are not shipped (:func:`program_text`).
"""

from __future__ import annotations

import functools
from importlib import resources

from adk_sandbox.executor.channel.setid import native_arch, setid_filter

__all__ = [
    "INSTALL_FILTER_SOURCE",
    "PRELUDE_LINE",
    "PROCESS_TOOLS_SOURCE",
    "in_container_program",
    "program_text",
]

#: The line of a program's source replaced by the shared prelude.
PRELUDE_LINE = "# @PRELUDE@"
#: Lines from this one to :data:`END_CHECK_ONLY_LINE` are for the checkers only: not shipped.
CHECK_ONLY_LINE = "# @CHECK-ONLY@"
END_CHECK_ONLY_LINE = "# @END-CHECK-ONLY@"


@functools.cache
def program_text(name: str) -> str:
    """The shipped text of ``inside/<name>``: the file without its checker-only lines."""
    text = resources.files(__package__).joinpath("inside", name).read_text(encoding="utf-8")
    shipped: list[str] = []
    checking = False
    for line in text.splitlines(keepends=True):
        marker = line.strip()
        if marker == CHECK_ONLY_LINE:
            checking = True
        elif marker == END_CHECK_ONLY_LINE:
            checking = False
        elif not checking:
            shipped.append(line)
    if checking:
        raise ValueError(f"inside/{name}: {CHECK_ONLY_LINE} without {END_CHECK_ONLY_LINE}")
    return "".join(shipped)


#: Python source, run inside the sandbox by a command's supervisor in the child before
#: exec: ``install_setid_filter(bytes.fromhex(...))``. Needs only ctypes and the C library.
INSTALL_FILTER_SOURCE = program_text("setid_filter.py")

#: Python source of the process tools every in-sandbox program shares (see the module docstring).
PROCESS_TOOLS_SOURCE = program_text("prelude.py")


def in_container_program(body: str) -> str:
    """``body`` with its :data:`PRELUDE_LINE` replaced by the set-id filter and the process tools."""
    if PRELUDE_LINE not in body:
        raise ValueError("an in-container program needs a prelude line")
    try:
        program = 'bytes.fromhex("' + setid_filter(native_arch()).hex() + '")'
    except OSError:  # an architecture without a filter: commands refuse to start (fail closed)
        program = "None"
    prelude = INSTALL_FILTER_SOURCE + "SETID = " + program + "\n" + PROCESS_TOOLS_SOURCE
    return body.replace(PRELUDE_LINE, prelude, 1)
