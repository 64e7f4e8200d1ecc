"""The widened ExecRequest on the host backends: argv without a shell, bytes stdin, cwd, user, refusals.

Run on a plain ProcessBackend and under bubblewrap (``ProcessBackend.with_sandbox``); the WASM backend's
refusals and its binary stdin are checked at the end. argv's shell-free arguments are a check of the
conformance suite (tests/conformance/test_conformance_host.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adk_sandbox.executor import (
    BubblewrapEnforcer,
    ExecRequest,
    InvalidRequestError,
    Language,
    PolicyNotEnforceableError,
    ProcessBackend,
    SandboxPolicy,
)
from adk_sandbox.executor._languages import MAX_ARGUMENT_BYTES, inline_argv
from tests.conftest import require

HOSTILE = "$(id) ; rm -rf x `id` * && echo pwned | cat > y"
BINARY = b"a\0b\xff\xfe\0\n\x80end"
_HEX = " ".join(f"{byte:02x}" for byte in BINARY)

BackendMaker = Callable[[Path], ProcessBackend]


def _plain(root: Path) -> ProcessBackend:
    return ProcessBackend(workdir=root)


@pytest.fixture(params=["process", "bwrap"])
def make_backend(request: pytest.FixtureRequest) -> BackendMaker:
    """A host backend whose policy (under bubblewrap) allows the test's directory read-write."""
    if request.param == "process":
        return _plain
    enforcer: BubblewrapEnforcer = request.getfixturevalue("bwrap_enforcer")

    def sandboxed(root: Path) -> ProcessBackend:
        policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(root).build()
        return ProcessBackend.with_sandbox(enforcer, policy, workdir=root)

    return sandboxed


def _argv(*argv: str, **fields: object) -> ExecRequest:
    return ExecRequest.model_validate({"argv": argv, "timeout": 30, **fields})


def test_argv_exit_status_and_missing_program(make_backend: BackendMaker, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    assert backend.execute(_argv("sh", "-c", "exit 7")).exit_code == 7
    missing = backend.execute(_argv("adk-no-such-program", "arg"))
    assert missing.exit_code == 127
    assert "adk-no-such-program" in missing.stderr


def test_argv_bare_name_resolves_on_the_requests_path(make_backend: BackendMaker, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "adk-own-tool"
    tool.write_text('#!/bin/sh\necho own tool "$@"\n')
    tool.chmod(0o755)
    result = make_backend(tmp_path).execute(
        _argv("adk-own-tool", "a b", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    )
    assert result.stdout == "own tool a b\n", result.stderr


@pytest.mark.parametrize("how", ["argv", "command", "python"])
def test_bytes_stdin_round_trips_unchanged(make_backend: BackendMaker, tmp_path: Path, how: str) -> None:
    if how == "argv":
        request = _argv("od", "-An", "-v", "-tx1", stdin=BINARY)
    elif how == "command":
        request = ExecRequest(
            language=Language.COMMAND, code="cat | od -An -v -tx1", stdin=BINARY, timeout=30
        )
    else:
        code = "import sys; print(' '.join(f'{b:02x}' for b in sys.stdin.buffer.read()))"
        request = ExecRequest(language=Language.PYTHON, code=code, stdin=BINARY, timeout=30)
    result = make_backend(tmp_path).execute(request)
    assert result.exit_code == 0, result.stderr
    assert " ".join(result.stdout.split()) == _HEX


def test_text_stdin_is_still_utf8(make_backend: BackendMaker, tmp_path: Path) -> None:
    result = make_backend(tmp_path).execute(_argv("od", "-An", "-tx1", stdin="é"))
    assert result.stdout.split() == ["c3", "a9"]


def test_cwd_is_used_for_the_call(make_backend: BackendMaker, tmp_path: Path) -> None:
    sub = tmp_path / "sub dir"
    sub.mkdir()
    backend = make_backend(tmp_path)
    assert backend.execute(_argv("pwd", cwd=str(sub))).stdout == f"{sub}\n"
    command = ExecRequest(language=Language.COMMAND, code="pwd", cwd=str(sub), timeout=30)
    assert backend.execute(command).stdout == f"{sub}\n"
    assert backend.execute(_argv("pwd")).stdout == f"{tmp_path}\n"  # the next call: the default again


def test_missing_cwd_is_refused_before_anything_runs(make_backend: BackendMaker, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    marker = tmp_path / "ran"
    for cwd in (tmp_path / "missing", tmp_path / "a-file"):
        (tmp_path / "a-file").touch()
        with pytest.raises(InvalidRequestError, match="is not a directory the command can enter") as info:
            backend.execute(_argv("touch", str(marker), cwd=str(cwd)))
        assert repr(str(cwd)) in str(info.value)
        assert backend.name in str(info.value)
    assert not marker.exists()


def test_bwrap_cwd_outside_the_sandbox_is_refused(bwrap_enforcer: BubblewrapEnforcer, tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(inside).build()
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=inside)
    with pytest.raises(InvalidRequestError, match="not visible in the bwrap sandbox"):
        backend.execute(_argv("pwd", cwd=str(outside)))
    # A runtime path the sandbox shows read-only is a fine cwd.
    assert backend.execute(_argv("pwd", cwd="/usr")).stdout == "/usr\n"


def test_own_user_runs_and_any_other_is_refused(make_backend: BackendMaker, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    me = f"{os.geteuid()}:{os.getegid()}"
    for user in (str(os.geteuid()), me):
        result = backend.execute(_argv("id", "-u", user=user))
        assert result.stdout == f"{os.geteuid()}\n", result.stderr
    marker = tmp_path / "ran"
    for other in (
        f"{os.geteuid() + 1}",
        f"{os.geteuid()}:{os.getegid() + 1}",
        "0:0" if os.geteuid() else "1000",
    ):
        with pytest.raises(PolicyNotEnforceableError, match="cannot run them as user") as info:
            backend.execute(_argv("touch", str(marker), user=other))
        assert "DockerBackend" in str(info.value)
    assert not marker.exists()


def test_an_argument_over_linux_limit_is_refused_clearly(make_backend: BackendMaker, tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    fits = backend.execute(_argv("sh", "-c", 'printf %s "$1" | wc -c', "sh", "x" * MAX_ARGUMENT_BYTES))
    assert fits.stdout.strip() == str(MAX_ARGUMENT_BYTES), fits.stderr
    with pytest.raises(InvalidRequestError, match=r"argv\[1\] is 307200 bytes.*stdin"):
        backend.execute(_argv("echo", "x" * 300 * 1024))


def test_a_long_command_string_runs(make_backend: BackendMaker, tmp_path: Path) -> None:
    # Longer than one argument may be: it travels in pieces joined by the shell, which then sees no
    # positional parameters, as with `sh -c CODE`.
    code = "x=" + "y" * (300 * 1024) + '; printf "%s %s" "${#x}" "$#"'
    result = make_backend(tmp_path).execute(ExecRequest(language=Language.COMMAND, code=code, timeout=30))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{300 * 1024} 0"


@pytest.mark.parametrize("language", [Language.PYTHON, Language.JAVASCRIPT, Language.COMMAND])
def test_the_joined_inline_forms_run_the_whole_code(tmp_path: Path, language: Language) -> None:
    """The Docker session's pieces-on-the-argv forms, run here directly as argv requests."""
    program = {"python": "python3", "javascript": "node", "command": "sh"}[language.value]
    require(shutil.which(program) is not None, f"{program} is not installed")
    padding = "z" * (200 * 1024)
    code = {
        Language.PYTHON: f"import sys\npad = '{padding}'\nprint(len(pad), sys.argv, __name__)\n",
        Language.JAVASCRIPT: f"const pad = '{padding}';\nconsole.log(pad.length, process.argv.length)\n",
        Language.COMMAND: f'pad={padding}\necho "${{#pad}}" "$#"\n',
    }[language]
    argv = inline_argv(language, code, shutil.which(program))
    assert len(argv) > 4  # really in pieces
    result = ProcessBackend(workdir=tmp_path).execute(_argv(*argv))
    assert result.exit_code == 0, result.stderr
    expected = {
        Language.PYTHON: f"{len(padding)} ['-c'] __main__\n",
        Language.JAVASCRIPT: f"{len(padding)} 1\n",
        Language.COMMAND: f"{len(padding)} 0\n",
    }[language]
    assert result.stdout == expected


# -- WASM ----------------------------------------------------------------------------------------------

# Reads stdin (up to 256 bytes) and prints every byte as two hex digits and a space.
_WASM_HEX = """(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "0123456789abcdef")
  (func (export "_start") (local $i i32) (local $n i32) (local $b i32)
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 256))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (local.set $n (i32.load (i32.const 8)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $b (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
      (i32.store8 (i32.add (i32.const 4096) (i32.mul (local.get $i) (i32.const 3)))
                  (i32.load8_u (i32.add (i32.const 16) (i32.shr_u (local.get $b) (i32.const 4)))))
      (i32.store8 (i32.add (i32.const 4097) (i32.mul (local.get $i) (i32.const 3)))
                  (i32.load8_u (i32.add (i32.const 16) (i32.and (local.get $b) (i32.const 15)))))
      (i32.store8 (i32.add (i32.const 4098) (i32.mul (local.get $i) (i32.const 3))) (i32.const 32))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.store (i32.const 0) (i32.const 4096))
    (i32.store (i32.const 4) (i32.mul (local.get $n) (i32.const 3)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""


@pytest.fixture
def wasm_backend() -> Any:
    require(importlib.util.find_spec("wasmtime") is not None, "wasmtime is not installed (extra `wasm`)")
    from adk_sandbox.executor import WasmBackend  # noqa: PLC0415 - only once require() has seen wasmtime

    return WasmBackend()


def test_wasm_bytes_stdin_round_trips(wasm_backend: Any) -> None:
    result = wasm_backend.execute(
        ExecRequest(language=Language.WASM, code=_WASM_HEX, stdin=BINARY, timeout=30)
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == _HEX


@pytest.mark.parametrize(
    ("fields", "error", "says"),
    [
        ({"argv": ["printf", "hi"]}, InvalidRequestError, "not a program from argv"),
        ({"language": "wasm", "code": _WASM_HEX, "cwd": "/tmp"}, InvalidRequestError, "omit cwd"),
        ({"language": "wasm", "code": _WASM_HEX, "user": "1000"}, PolicyNotEnforceableError, "omit user"),
    ],
)
def test_wasm_refuses_what_a_module_cannot_have(
    wasm_backend: Any, fields: dict[str, object], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says) as info:
        wasm_backend.execute(ExecRequest.model_validate({"timeout": 30, **fields}))
    assert "'wasm'" in str(info.value)


def test_bwrap_never_widens_the_sandbox_for_an_argv_program(
    bwrap_enforcer: BubblewrapEnforcer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A program outside what the policy shows: binding its installation (the directory above its bin/)
    # would expose the host files next to it, here a secret.
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("host secret\n")
    (outside / "bin").mkdir()
    tool = outside / "bin" / "adk-cat-secret"
    tool.write_text(f"#!/bin/sh\ncat {outside}/secret\n")
    tool.chmod(0o755)
    policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(tmp_path).build()
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=tmp_path)
    result = backend.execute(_argv(str(tool)))
    assert result.exit_code == 127
    assert "not visible in the bwrap sandbox" in result.stderr
    assert "host secret" not in result.stdout
    # The same program is fine once the policy shows it, and it still cannot read what is not shown.
    shown = (
        SandboxPolicy.builder().allow_process_spawn().allow_read_write(tmp_path).allow_read(outside / "bin")
    )
    result = ProcessBackend.with_sandbox(bwrap_enforcer, shown.build(), workdir=tmp_path).execute(
        _argv(str(tool))
    )
    assert "host secret" not in result.stdout
    assert "No such file" in result.stderr
