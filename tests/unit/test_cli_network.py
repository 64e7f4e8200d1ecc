"""``--allow-host`` on the commands that start sandboxes (``run``, ``mcp``): a NetworkPolicy, checked."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from adk_sandbox.executor.cli import _proxy_of, _sandbox_options, backend_config, main
from adk_sandbox.executor.errors import InvalidRequestError
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.conftest import require


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _sandbox_options(parser, image_help="image")
    return parser.parse_args(list(argv))


def test_allow_host_options_make_a_network_policy() -> None:
    config = backend_config(_args("--allow-host", "pypi.org", "--allow-host", "*.pythonhosted.org:8443"))
    assert config.network == NetworkPolicy(allow=["pypi.org", "*.pythonhosted.org:8443"])
    assert config.egress == config.network


def test_without_allow_host_the_network_stays_off() -> None:
    config = backend_config(_args("--runtime", "runsc"))
    assert config.network is False and config.egress is None


def test_a_bad_allow_host_is_refused_naming_the_option() -> None:
    with pytest.raises(InvalidRequestError, match=r"--allow-host: .*is an IP address"):
        backend_config(_args("--allow-host", "10.0.0.1"))


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--workspace", ".", "--allow-host", "bad host", "--", "true"],
        ["mcp", "--workspace", ".", "--allow-host", "bad host"],
    ],
)
def test_run_and_mcp_refuse_a_bad_allow_host_before_starting_anything(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    require(importlib.util.find_spec("mcp") is not None, "the mcp extra is not installed")
    assert main(argv) == 2
    assert "--allow-host" in capsys.readouterr().err


def test_doctor_says_whether_the_agent_serves_the_proxy() -> None:
    assert _proxy_of(True).startswith("yes") and _proxy_of(False).startswith("no")
    assert _proxy_of(None).startswith("no")
