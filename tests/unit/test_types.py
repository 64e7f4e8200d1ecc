"""Unit tests of the core types: requests, isolation classes, policies, child environment, error tree."""

from __future__ import annotations

import itertools
import operator
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adk_sandbox import executor
from adk_sandbox.executor import errors as errors_module
from adk_sandbox.executor._env import build_child_env
from adk_sandbox.executor.errors import (
    BackendUnavailableError,
    EnforcerUnavailableError,
    ExecutorError,
    InvalidRequestError,
    PolicyNotEnforceableError,
    SandboxFailedError,
)
from adk_sandbox.executor.policy import AllowedPath, SandboxPolicy, SandboxPolicyBuilder
from adk_sandbox.executor.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecRequest,
    ExecResult,
    IsolationClass,
    Language,
    parse_user,
    validate_env,
)

# --------------------------------------------------------------------------------------------------
# ExecRequest


def _request(**overrides: Any) -> ExecRequest:
    fields: dict[str, Any] = {"language": "command", "code": "echo hi", "timeout": 10}
    fields.update(overrides)
    return ExecRequest(**fields)


def _error_locations(exc: ValidationError) -> set[tuple[int | str, ...]]:
    return {tuple(error["loc"]) for error in exc.errors()}


def test_minimal_request_defaults() -> None:
    request = _request()
    assert request.language is Language.COMMAND
    assert request.code == "echo hi"
    assert request.timeout == 10.0
    assert request.stdin is None
    assert request.env == {}
    assert request.memory_limit_mb is None
    assert request.max_output_bytes is None


def test_timeout_is_required() -> None:
    with pytest.raises(ValidationError) as info:
        ExecRequest(language=Language.COMMAND, code="true")  # type: ignore[call-arg]
    assert _error_locations(info.value) == {("timeout",)}
    assert info.value.errors()[0]["type"] == "missing"
    assert "timeout" in str(info.value)


@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.001, float("-inf")])
def test_non_positive_timeout_is_rejected(timeout: float) -> None:
    with pytest.raises(ValidationError) as info:
        _request(timeout=timeout)
    assert ("timeout",) in _error_locations(info.value)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf")])
def test_non_finite_timeout_is_rejected(timeout: float) -> None:
    with pytest.raises(ValidationError) as info:
        _request(timeout=timeout)
    assert ("timeout",) in _error_locations(info.value)


def test_small_positive_timeout_is_accepted() -> None:
    assert _request(timeout=0.001).timeout == 0.001


@pytest.mark.parametrize("language", ["cobol", "", "Python", "sh", 3])
def test_unknown_language_is_rejected(language: object) -> None:
    with pytest.raises(ValidationError) as info:
        _request(language=language)
    assert ("language",) in _error_locations(info.value)


@pytest.mark.parametrize("language", ["command", "python", "javascript", "typescript", "rust", "wasm"])
def test_every_spec_language_is_accepted(language: str) -> None:
    request = _request(language=language)
    assert request.language == language
    assert request.language is Language(language)


def test_nul_in_code_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        _request(code="echo a\0b")
    assert ("code",) in _error_locations(info.value)
    assert "NUL" in str(info.value)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"": "x"}, id="empty-name"),
        pytest.param({"A=B": "x"}, id="equals-in-name"),
        pytest.param({"=": "x"}, id="only-equals"),
        pytest.param({"A\0B": "x"}, id="nul-in-name"),
        pytest.param({"OK": "a\0b"}, id="nul-in-value"),
        pytest.param({"GOOD": "1", "BAD=": "2"}, id="one-bad-among-good"),
    ],
)
def test_bad_env_is_rejected(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError) as info:
        _request(env=env)
    assert any(loc[0] == "env" for loc in _error_locations(info.value))
    with pytest.raises(ValueError, match="environment variable"):
        validate_env(env)


def test_good_env_is_kept() -> None:
    env = {"A": "1", "lower_case": "", "WITH_SPACE_VALUE": "a b = c"}
    assert _request(env=env).env == env
    assert validate_env(env) is env


def test_extra_fields_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        _request(timeout_secs=5)
    assert ("timeout_secs",) in _error_locations(info.value)


def test_request_is_frozen() -> None:
    request = _request()
    with pytest.raises(ValidationError):
        request.timeout = 99  # type: ignore[misc]
    with pytest.raises(ValidationError):
        request.code = "rm -rf /"  # type: ignore[misc]
    assert request.timeout == 10
    assert request.code == "echo hi"


def test_output_cap_defaults_to_one_mib() -> None:
    assert DEFAULT_MAX_OUTPUT_BYTES == 1024 * 1024
    assert _request().output_cap == 1024 * 1024


def test_output_cap_respects_max_output_bytes() -> None:
    assert _request(max_output_bytes=4096).output_cap == 4096
    assert _request(max_output_bytes=1).output_cap == 1
    assert _request(max_output_bytes=50 * 1024 * 1024).output_cap == 50 * 1024 * 1024


@pytest.mark.parametrize("field", ["max_output_bytes", "memory_limit_mb"])
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_limits_are_rejected(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as info:
        _request(**{field: value})
    assert (field,) in _error_locations(info.value)


def test_request_round_trips_through_json() -> None:
    request = _request(language="python", stdin="in\n", env={"K": "V"}, max_output_bytes=10)
    assert ExecRequest.model_validate_json(request.model_dump_json()) == request


# --------------------------------------------------------------------------------------------------
# ExecRequest: argv, cwd, user, bytes stdin


def _argv_request(**overrides: Any) -> ExecRequest:
    fields: dict[str, Any] = {"argv": ["printf", "%s", "x"], "timeout": 10}
    fields.update(overrides)
    return ExecRequest(**fields)


def test_argv_request_has_no_language_and_no_code() -> None:
    request = _argv_request()
    assert request.argv == ("printf", "%s", "x")  # a list is taken as the tuple
    assert request.language is None
    assert request.code is None


def test_argv_elements_are_kept_verbatim() -> None:
    hostile = ("sh", "-c", "$(id) ; rm -rf / #", "*", "'\"", " ", "")
    assert _argv_request(argv=hostile).argv == hostile


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"argv": ["true"], "code": "true"}, "not both"),
        ({"argv": ["true"], "language": "command", "code": "true"}, "not both"),
        ({"argv": ["true"], "language": "command"}, "takes no language"),
        ({}, "nothing to run"),
        ({"language": "command"}, "nothing to run"),
        ({"code": "echo hi"}, "code needs a language"),
    ],
)
def test_exactly_one_of_code_and_argv(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        ExecRequest(timeout=10, **fields)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "at least one element"),
        ([""], "must not be empty"),
        (["printf", "a\0b"], "argv[1] contains a NUL"),
        (["tr\0ue"], "argv[0] contains a NUL"),
    ],
)
def test_bad_argv_is_rejected(argv: list[str], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        _argv_request(argv=argv)
    assert ("argv",) in _error_locations(info.value)
    assert says in str(info.value)


def test_argv_must_be_strings() -> None:
    with pytest.raises(ValidationError):
        _argv_request(argv=["echo", 3])
    with pytest.raises(ValidationError):
        _argv_request(argv="echo hi")


@pytest.mark.parametrize("cwd", ["/", "/tmp", "/a b/c", "/x/../y"])
def test_absolute_cwd_is_kept_as_given(cwd: str) -> None:
    assert _request(cwd=cwd).cwd == cwd
    assert _argv_request(cwd=cwd).cwd == cwd


@pytest.mark.parametrize(("cwd", "says"), [("tmp", "absolute"), ("", "absolute"), ("./x", "absolute"),
                                           ("/tmp/a\0b", "NUL")])  # fmt: skip
def test_bad_cwd_is_rejected(cwd: str, says: str) -> None:
    with pytest.raises(ValidationError) as info:
        _request(cwd=cwd)
    assert ("cwd",) in _error_locations(info.value)
    assert says in str(info.value)


@pytest.mark.parametrize("user", ["0", "1000", "1000:1000", "65534:65534", "4294967294:0"])
def test_numeric_user_is_accepted(user: str) -> None:
    assert _request(user=user).user == user


@pytest.mark.parametrize(
    "user", ["root", "app:app", "1000:staff", "app:0", "_apt", "www-data", "user.name", "m$"]
)
def test_user_names_are_accepted(user: str) -> None:
    assert _request(user=user).user == user  # looked up where the command runs


# Fullwidth digits ("\uff11...") are digits to str.isdigit, but not ids.
@pytest.mark.parametrize("user", ["", ":", "1000:", ":1000", "-1", "1000:1000:1", " 1000", "1e3", "a b",
                                  "root:", "9app", "a:b:c", "x" * 33, "app;id", "../etc",
                                  "4294967295", "0:4294967295", "\uff11\uff10\uff10\uff10"])  # fmt: skip
def test_non_numeric_or_out_of_range_user_is_rejected(user: str) -> None:
    with pytest.raises(ValidationError) as info:
        _request(user=user)
    assert ("user",) in _error_locations(info.value)


def test_parse_user() -> None:
    assert parse_user("1000") == (1000, None)
    assert parse_user("0:5") == (0, 5)
    with pytest.raises(ValueError, match="numeric"):
        parse_user("nobody")


def test_bytes_stdin_is_kept_unchanged() -> None:
    data = b"\0\xff\xfe binary\n\0"
    request = _request(stdin=data)
    assert request.stdin == data
    assert isinstance(request.stdin, bytes)
    assert request.stdin_bytes == data


def test_text_stdin_stays_text_and_is_sent_as_utf8() -> None:
    request = _request(stdin="héllo\0")
    assert isinstance(request.stdin, str)
    assert request.stdin_bytes == "héllo\0".encode()
    assert _request().stdin_bytes is None


def test_argv_request_round_trips_through_json() -> None:
    request = _argv_request(cwd="/w", user="1:2", stdin="t", env={"A": "b"})
    assert ExecRequest.model_validate_json(request.model_dump_json()) == request


def test_exec_result_non_zero_exit_is_a_result() -> None:
    result = ExecResult(stdout="", stderr="boom\n", exit_code=3, duration_ms=5)
    assert result.ok is False
    assert result.timed_out is False
    assert result.oom_killed is False
    assert result.stdout_truncated is False
    assert result.stderr_truncated is False
    assert ExecResult(stdout="", stderr="", exit_code=0, duration_ms=1).ok is True
    assert ExecResult(stdout="", stderr="", exit_code=None, timed_out=True, duration_ms=1).ok is False


# --------------------------------------------------------------------------------------------------
# IsolationClass

WEAKEST_TO_STRONGEST = [
    IsolationClass.SUBPROCESS_ONLY,
    IsolationClass.OS_ENFORCED,
    IsolationClass.CONTAINER,
    IsolationClass.GVISOR,
    IsolationClass.MICROVM,
    IsolationClass.WASM,
]

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def test_isolation_class_values() -> None:
    assert [c.value for c in WEAKEST_TO_STRONGEST] == [
        "subprocess_only",
        "os_enforced",
        "container",
        "gvisor",
        "microvm",
        "wasm",
    ]
    assert list(IsolationClass) == WEAKEST_TO_STRONGEST  # no other members
    for cls in IsolationClass:
        assert isinstance(cls, str)
        assert cls == cls.value
        assert str(cls) == cls.value
        assert IsolationClass(cls.value) is cls


@pytest.mark.parametrize("op", list(OPERATORS))
def test_isolation_class_ordering_all_pairs(op: str) -> None:
    compare = OPERATORS[op]
    for (i, a), (j, b) in itertools.product(enumerate(WEAKEST_TO_STRONGEST), repeat=2):
        assert compare(a, b) is compare(i, j), f"{a.value} {op} {b.value}"


def test_isolation_class_ordering_is_not_alphabetical() -> None:
    # Pairs whose alphabetical order disagrees with the isolation order: a str-ordering bug fails here.
    assert IsolationClass.OS_ENFORCED < IsolationClass.GVISOR  # "os_enforced" > "gvisor"
    assert IsolationClass.OS_ENFORCED < IsolationClass.CONTAINER  # "os_enforced" > "container"
    assert IsolationClass.SUBPROCESS_ONLY < IsolationClass.OS_ENFORCED  # "subprocess_only" > "os..."
    assert IsolationClass.SUBPROCESS_ONLY <= IsolationClass.WASM
    assert IsolationClass.GVISOR > IsolationClass.OS_ENFORCED
    assert IsolationClass.CONTAINER >= IsolationClass.OS_ENFORCED
    assert not IsolationClass.SUBPROCESS_ONLY >= IsolationClass.CONTAINER
    assert not IsolationClass.OS_ENFORCED >= IsolationClass.CONTAINER
    assert not IsolationClass.OS_ENFORCED > IsolationClass.GVISOR
    assert sorted(c.value for c in WEAKEST_TO_STRONGEST) != [c.value for c in WEAKEST_TO_STRONGEST]


def test_isolation_class_sorted_min_max() -> None:
    rng = random.Random(1234)
    for _ in range(20):
        shuffled = list(WEAKEST_TO_STRONGEST)
        rng.shuffle(shuffled)
        assert sorted(shuffled) == WEAKEST_TO_STRONGEST
        assert sorted(shuffled, reverse=True) == WEAKEST_TO_STRONGEST[::-1]
    assert min(IsolationClass) is IsolationClass.SUBPROCESS_ONLY
    assert max(IsolationClass) is IsolationClass.WASM
    assert [c.rank for c in WEAKEST_TO_STRONGEST] == [0, 1, 2, 3, 4, 5]


def test_isolation_class_threshold_check() -> None:
    at_least_container = [c for c in IsolationClass if c >= IsolationClass.CONTAINER]
    assert at_least_container == [
        IsolationClass.CONTAINER,
        IsolationClass.GVISOR,
        IsolationClass.MICROVM,
        IsolationClass.WASM,
    ]


def test_isolation_class_as_dict_key_and_string() -> None:
    by_class = {IsolationClass.CONTAINER: "docker", IsolationClass.GVISOR: "runsc"}
    assert by_class["container"] == "docker"
    assert by_class["gvisor"] == "runsc"
    by_name = {"os_enforced": "bwrap"}
    assert by_name[IsolationClass.OS_ENFORCED] == "bwrap"
    for cls in IsolationClass:
        assert hash(cls) == hash(cls.value)
        assert cls == cls.value
        assert cls.value == cls
    assert {IsolationClass.WASM, "wasm"} == {"wasm"}
    assert IsolationClass.CONTAINER != "gvisor"
    assert IsolationClass("gvisor") is IsolationClass.GVISOR


def test_isolation_class_comparison_with_other_types_raises() -> None:
    with pytest.raises(TypeError):
        _ = IsolationClass.CONTAINER < 3
    with pytest.raises(TypeError):
        _ = IsolationClass.CONTAINER >= None


def test_isolation_class_comparison_with_plain_string_is_never_alphabetical() -> None:
    # A plain string such as a config value must not be compared alphabetically: that would rate
    # `IsolationClass.SUBPROCESS_ONLY >= "container"` as true (fail open). Raising TypeError is fine too.
    wrong: list[str] = []
    for (op, compare), ((i, a), (j, b)) in itertools.product(
        OPERATORS.items(), itertools.product(enumerate(WEAKEST_TO_STRONGEST), repeat=2)
    ):
        for left, right in ((a, b.value), (a.value, b)):
            try:
                outcome = compare(left, right)
            except TypeError:
                continue
            if outcome is not compare(i, j):
                wrong.append(f"{left!r} {op} {right!r} is {outcome}")
    assert wrong == []


def test_isolation_class_survives_pydantic_round_trip() -> None:
    capabilities = executor.Capabilities(
        isolation="gvisor",
        timeout=True,
        memory=True,
        cpu=True,
        pids=True,
        network=True,
        fs_read=True,
        fs_write=True,
        env=True,
        languages=("command",),
    )
    assert capabilities.isolation is IsolationClass.GVISOR
    dumped = capabilities.model_dump(mode="json")
    assert dumped["isolation"] == "gvisor"
    assert executor.Capabilities.model_validate(dumped) == capabilities


# --------------------------------------------------------------------------------------------------
# SandboxPolicy


def test_default_policy_denies_everything() -> None:
    policy = SandboxPolicy()
    assert tuple(policy.allowed_paths) == ()
    assert policy.allow_network is False
    assert policy.allow_process_spawn is False
    assert policy.env == {}
    assert policy.read_only_paths == ()
    assert policy.read_write_paths == ()
    assert SandboxPolicy.builder().build() == policy


def test_builder_produces_expected_policy(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    rw = str(tmp_path / "rw")
    policy = (
        SandboxPolicy.builder()
        .allow_read(ro)
        .allow_read_write(rw)
        .allow_network()
        .allow_process_spawn()
        .env("A", "1")
        .env("B", "2")
        .env("A", "3")
        .build()
    )
    assert isinstance(SandboxPolicy.builder(), SandboxPolicyBuilder)
    assert isinstance(policy, SandboxPolicy)
    assert list(policy.allowed_paths) == [
        AllowedPath(path=str(ro), mode="read_only"),
        AllowedPath(path=rw, mode="read_write"),
    ]
    assert policy.allow_network is True
    assert policy.allow_process_spawn is True
    assert policy.env == {"A": "3", "B": "2"}
    assert policy == SandboxPolicy(
        allowed_paths=[
            AllowedPath(path=str(ro), mode="read_only"),
            AllowedPath(path=rw, mode="read_write"),
        ],
        allow_network=True,
        allow_process_spawn=True,
        env={"A": "3", "B": "2"},
    )


def test_builder_can_be_reused_without_aliasing() -> None:
    builder = SandboxPolicy.builder().allow_read("/usr").env("K", "1")
    first = builder.build()
    builder.allow_read_write("/tmp").env("K", "2")
    second = builder.build()
    assert first.read_only_paths == ("/usr",)
    assert first.read_write_paths == ()
    assert first.env == {"K": "1"}
    assert second.read_write_paths == ("/tmp",)
    assert second.env == {"K": "2"}


@pytest.mark.parametrize("path", ["relative/dir", "./here", "..", "", "~/secrets"])
def test_relative_path_is_rejected(path: str) -> None:
    with pytest.raises(ValidationError, match="absolute"):
        AllowedPath(path=path)
    with pytest.raises(ValidationError):
        SandboxPolicy.builder().allow_read(path)
    with pytest.raises(ValidationError):
        SandboxPolicy.builder().allow_read_write(path)


def test_nul_in_path_is_rejected() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        AllowedPath(path="/tmp/a\0b")


def test_bad_mode_is_rejected() -> None:
    with pytest.raises(ValidationError):
        AllowedPath(path="/tmp", mode="write_only")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("/usr/lib/", "/usr/lib"),
        ("/usr/./lib", "/usr/lib"),
        ("/usr/share/../lib", "/usr/lib"),
        ("/usr///lib", "/usr/lib"),
        ("/", "/"),
        ("/a/b/../../c/./d/", "/c/d"),
    ],
)
def test_path_is_normalised(given: str, normalised: str) -> None:
    assert AllowedPath(path=given).path == normalised
    assert SandboxPolicy.builder().allow_read(given).build().read_only_paths == (normalised,)


def test_allowed_path_default_mode_is_read_only() -> None:
    assert AllowedPath(path="/srv").mode == "read_only"


def test_read_only_and_read_write_paths() -> None:
    policy = (
        SandboxPolicy.builder()
        .allow_read("/usr")
        .allow_read_write("/work")
        .allow_read("/etc/ssl")
        .allow_read_write("/tmp/out")
        .build()
    )
    assert policy.read_only_paths == ("/usr", "/etc/ssl")
    assert policy.read_write_paths == ("/work", "/tmp/out")


def test_policy_is_frozen_and_strict() -> None:
    policy = SandboxPolicy()
    with pytest.raises(ValidationError):
        policy.allow_network = True  # type: ignore[misc]
    assert policy.allow_network is False
    with pytest.raises(ValidationError):
        SandboxPolicy(allow_everything=True)  # type: ignore[call-arg]


@pytest.mark.parametrize("env", [{"": "x"}, {"A=B": "x"}, {"A\0": "x"}, {"A": "\0"}])
def test_policy_env_is_validated(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        SandboxPolicy(env=env)
    name, value = next(iter(env.items()))
    with pytest.raises(ValidationError):
        SandboxPolicy.builder().env(name, value).build()


# --------------------------------------------------------------------------------------------------
# build_child_env


def test_child_env_precedence_base_policy_request() -> None:
    base = {"PATH": "/image/bin", "HOME": "/home/image", "LANG": "C.UTF-8", "ONLY_BASE": "b"}
    policy_env = {"HOME": "/home/policy", "LANG": "en_US.UTF-8", "ONLY_POLICY": "p"}
    request_env = {"LANG": "de_DE.UTF-8", "ONLY_REQUEST": "r"}
    env = build_child_env(base, policy_env, request_env)
    assert env == {
        "PATH": "/image/bin",  # base only
        "HOME": "/home/policy",  # policy overrides base
        "LANG": "de_DE.UTF-8",  # request overrides policy and base
        "ONLY_BASE": "b",
        "ONLY_POLICY": "p",
        "ONLY_REQUEST": "r",
    }


def test_child_env_with_a_real_policy_and_request() -> None:
    policy = SandboxPolicy.builder().env("MODE", "policy").env("P", "1").build()
    request = _request(env={"MODE": "request"})
    env = build_child_env({"MODE": "base"}, policy.env, request.env)
    assert env == {"MODE": "request", "P": "1"}


SENTINEL_NAME = "ADK_SANDBOX_TEST_SENTINEL"
SENTINEL_VALUE = "sentinel-value-must-not-leak"


def test_child_env_leaks_nothing_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SENTINEL_NAME, SENTINEL_VALUE)
    monkeypatch.setenv("PATH", "/host/secret/bin")
    assert build_child_env() == {}
    assert build_child_env(None, None, None) == {}
    assert build_child_env({}, {}, {}) == {}
    env = build_child_env({"LANG": "C"}, {"P": "1"}, {"R": "2"})
    assert env == {"LANG": "C", "P": "1", "R": "2"}
    assert SENTINEL_NAME not in env
    assert SENTINEL_VALUE not in env.values()
    assert "PATH" not in env
    assert os.environ[SENTINEL_NAME] == SENTINEL_VALUE  # the sentinel really was set


def test_child_env_is_a_fresh_dict() -> None:
    base = {"A": "1"}
    policy_env = {"B": "2"}
    request_env = {"C": "3"}
    env = build_child_env(base, policy_env, request_env)
    env["D"] = "4"
    assert base == {"A": "1"}
    assert policy_env == {"B": "2"}
    assert request_env == {"C": "3"}
    assert build_child_env(base) is not base


# --------------------------------------------------------------------------------------------------
# ExecutorError tree

EXPECTED_PARENTS: dict[type[Exception], type[Exception]] = {
    InvalidRequestError: ExecutorError,
    BackendUnavailableError: ExecutorError,
    EnforcerUnavailableError: BackendUnavailableError,
    PolicyNotEnforceableError: ExecutorError,
    SandboxFailedError: ExecutorError,
}


def _docstring_tree() -> dict[str, str | None]:
    """Parse the box-drawing tree in errors.py's docstring into {name: parent name}."""
    doc = errors_module.__doc__
    assert doc is not None
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name)
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│ ]*[├└]── )?)([A-Z]\w*Error)\b", line)
        if match is None:
            continue
        column, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


def test_docstring_tree_is_parsed() -> None:
    tree = _docstring_tree()
    assert tree == {
        "ExecutorError": None,
        "InvalidRequestError": "ExecutorError",
        "BackendUnavailableError": "ExecutorError",
        "EnforcerUnavailableError": "BackendUnavailableError",
        "PolicyNotEnforceableError": "ExecutorError",
        "SandboxFailedError": "ExecutorError",
    }


def test_error_classes_match_the_docstring_tree() -> None:
    for name, parent in _docstring_tree().items():
        cls = getattr(errors_module, name)
        assert issubclass(cls, Exception)
        if parent is None:
            assert cls.__bases__ == (Exception,)
        else:
            assert issubclass(cls, getattr(errors_module, parent)), f"{name} is not a {parent}"
            assert getattr(errors_module, parent) in cls.__bases__, f"{parent} is not {name}'s parent"


@pytest.mark.parametrize(("cls", "parent"), list(EXPECTED_PARENTS.items()))
def test_error_class_parents(cls: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(cls, parent)
    assert issubclass(cls, ExecutorError)
    assert parent in cls.__bases__
    with pytest.raises(parent):
        raise cls("boom")
    with pytest.raises(ExecutorError):
        raise cls("boom")


def test_siblings_are_not_subclasses_of_each_other() -> None:
    siblings = [InvalidRequestError, BackendUnavailableError, PolicyNotEnforceableError, SandboxFailedError]
    for a, b in itertools.permutations(siblings, 2):
        assert not issubclass(a, b), f"{a.__name__} must not be a {b.__name__}"
    assert not issubclass(BackendUnavailableError, EnforcerUnavailableError)


def test_invalid_request_error_is_also_a_value_error() -> None:
    assert issubclass(InvalidRequestError, ValueError)
    with pytest.raises(ValueError, match="bad"):
        raise InvalidRequestError("bad request")
    for cls in (BackendUnavailableError, EnforcerUnavailableError, PolicyNotEnforceableError):
        assert not issubclass(cls, ValueError)


def test_every_error_in_the_docstring_is_exported() -> None:
    names = set(_docstring_tree())
    assert names
    assert names <= set(executor.__all__)
    assert names <= set(errors_module.__all__)
    for name in names:
        assert getattr(executor, name) is getattr(errors_module, name)


def test_every_exported_error_is_in_the_docstring_tree() -> None:
    exported_errors = {
        name
        for name in executor.__all__
        if isinstance(getattr(executor, name), type) and issubclass(getattr(executor, name), BaseException)
    }
    assert exported_errors == set(_docstring_tree())
