"""The programs the conformance suite runs, written once per language a backend may offer.

A check that holds for any backend (a result, a timeout, the output caps, binary stdin, the memory limit)
asks for a program by what it does; :func:`programs_for` picks the dialect of a backend's languages: a
``sh -c`` command where the backend has a shell, a WASI module (WAT text) where it runs only WASM.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from adk_sandbox.executor.types import Language

__all__ = ["CommandPrograms", "Programs", "WasmPrograms", "programs_for"]


@dataclass(frozen=True)
class Programs:
    """Programs in one language; each method returns the source text (``ExecRequest.code``)."""

    language: Language

    def results(self, exit_code: int) -> str:
        r"""Writes ``out\\n`` to stdout and ``err\\n`` to stderr, then exits with ``exit_code``."""
        raise NotImplementedError

    def hang(self, marker: str) -> str:
        r"""Writes ``started\\n``, then runs until killed (a shell starts ``sleep <marker>`` children)."""
        raise NotImplementedError

    def output(self, head: str, body: str, times: int, tail: str) -> str:
        """Writes ``head + body * times + tail`` to stdout (ASCII text), then exits 0."""
        raise NotImplementedError

    def stdin_hex(self) -> str:
        """Writes every byte of stdin as two hex digits, separated by white space."""
        raise NotImplementedError

    def allocate(self, megabytes: int) -> str:
        """Allocates and touches ``megabytes`` MiB of memory (or more); writes ``survived`` if it could."""
        raise NotImplementedError

    def pwd(self) -> str:
        """Writes its working directory (where the language has one; else :meth:`results`)."""
        raise NotImplementedError

    def whoami(self) -> str:
        """Writes its uid and gid on two lines (where the language has them; else :meth:`results`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CommandPrograms(Programs):
    """``sh -c`` commands, using only POSIX utilities (and ``od``, ``dd``, ``sleep``, ``id``)."""

    language: Language = Language.COMMAND

    def results(self, exit_code: int) -> str:
        return f"echo out; echo err >&2; exit {exit_code}"

    def hang(self, marker: str) -> str:
        return f"echo started; (sleep {marker}) & sleep {marker}"

    def output(self, head: str, body: str, times: int, tail: str) -> str:
        return (
            f"printf '%s' {shlex.quote(head)}; i=0; while [ $i -lt {times} ]; do "
            f"printf '%s' {shlex.quote(body)}; i=$((i+1)); done; printf '%s' {shlex.quote(tail)}"
        )

    def stdin_hex(self) -> str:
        return "od -An -v -tx1"

    def allocate(self, megabytes: int) -> str:
        # dd's buffer is one block: reading /dev/zero into it touches every page of it.
        return f"dd if=/dev/zero of=/dev/null bs={megabytes}M count=1 2>/dev/null && echo survived"

    def pwd(self) -> str:
        return "pwd"

    def whoami(self) -> str:
        return "id -u; id -g"


_FD_WRITE = (
    '(import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))'
)
_FD_READ = '(import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))'
_PROC_EXIT = '(import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))'
_PAGE = 64 * 1024


def _wat(writes: Sequence[tuple[int, bytes, int]], end: str) -> str:
    """A module writing each ``(fd, data, times)`` in turn, then ending as ``end`` says (WAT text).

    ``end``: ``"exit N"`` (``proc_exit(N)``), ``"loop"`` (forever), ``"grow"`` (grows its memory a page at
    a time until refused, then traps: what exhausting a memory cap looks like).
    """
    data: list[str] = []
    body: list[str] = []
    offset = 1024
    for fd, text, times in writes:
        escaped = "".join(f"\\{byte:02x}" for byte in text)
        data.append(f'(data (i32.const {offset}) "{escaped}")')
        body.append(
            f"(i32.store (i32.const 0) (i32.const {offset}))"
            f" (i32.store (i32.const 4) (i32.const {len(text)}))"
            f" (local.set $i (i32.const 0)) (loop $again"
            f" (drop (call $fd_write (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 8)))"
            " (local.set $i (i32.add (local.get $i) (i32.const 1)))"
            f" (br_if $again (i32.lt_u (local.get $i) (i32.const {times}))))"
        )
        offset += len(text)
    if offset > _PAGE:
        raise ValueError("the texts of a conformance module must fit in its one page of memory")
    if end == "loop":
        body.append("(loop $forever (br $forever))")
    elif end == "grow":
        body.append(
            "(loop $grow (br_if $grow (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) unreachable"
        )
    else:
        body.append(f"(call $proc_exit (i32.const {int(end.removeprefix('exit '))}))")
    return (
        f'(module {_FD_WRITE} {_PROC_EXIT} (memory (export "memory") 1) {" ".join(data)}\n'
        f'  (func (export "_start") (local $i i32)\n    {" ".join(body)}))'
    )


# Reads stdin (up to 4096 bytes) and writes every byte as two hex digits and a space.
_WASM_STDIN_HEX = f"""(module {_FD_READ} {_FD_WRITE}
  (memory (export "memory") 1)
  (data (i32.const 16) "0123456789abcdef")
  (func (export "_start") (local $i i32) (local $n i32) (local $b i32)
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 4096))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (local.set $n (i32.load (i32.const 8)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $b (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
      (i32.store8 (i32.add (i32.const 8192) (i32.mul (local.get $i) (i32.const 3)))
                  (i32.load8_u (i32.add (i32.const 16) (i32.shr_u (local.get $b) (i32.const 4)))))
      (i32.store8 (i32.add (i32.const 8193) (i32.mul (local.get $i) (i32.const 3)))
                  (i32.load8_u (i32.add (i32.const 16) (i32.and (local.get $b) (i32.const 15)))))
      (i32.store8 (i32.add (i32.const 8194) (i32.mul (local.get $i) (i32.const 3))) (i32.const 32))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.store (i32.const 0) (i32.const 8192))
    (i32.store (i32.const 4) (i32.mul (local.get $n) (i32.const 3)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""


@dataclass(frozen=True)
class WasmPrograms(Programs):
    """WASI preview-1 modules as WAT text, importing only ``fd_read``, ``fd_write`` and ``proc_exit``."""

    language: Language = Language.WASM

    def results(self, exit_code: int) -> str:
        return _wat([(1, b"out\n", 1), (2, b"err\n", 1)], f"exit {exit_code}")

    def hang(self, marker: str) -> str:
        return _wat([(1, b"started\n", 1)], "loop")

    def output(self, head: str, body: str, times: int, tail: str) -> str:
        return _wat([(1, head.encode(), 1), (1, body.encode(), times), (1, tail.encode(), 1)], "exit 0")

    def stdin_hex(self) -> str:
        return _WASM_STDIN_HEX

    def allocate(self, megabytes: int) -> str:
        return _wat([], "grow")  # up to the request's memory_limit_mb, then a trap

    def pwd(self) -> str:
        return self.results(0)

    def whoami(self) -> str:
        return self.results(0)


def programs_for(languages: Sequence[Language]) -> Programs | None:
    """The dialect for a backend offering ``languages``: its shell's, else WASM's, else None."""
    if Language.COMMAND in languages:
        return CommandPrograms()
    if Language.WASM in languages:
        return WasmPrograms()
    return None
