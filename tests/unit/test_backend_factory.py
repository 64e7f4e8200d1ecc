"""The config union and the factory's checks (pure logic): a mapping in, the typed config out, refusals."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from adk_sandbox import BackendConfig, make_backend
from adk_sandbox.executor.backends.bwrap import BwrapConfig
from adk_sandbox.executor.backends.docker import DockerConfig
from adk_sandbox.executor.backends.factory import WasmConfig, parse_config
from adk_sandbox.executor.backends.kubernetes import KubernetesConfig
from adk_sandbox.executor.backends.microvm import MicroVMConfig
from adk_sandbox.executor.backends.process import ProcessConfig
from adk_sandbox.executor.cli import _sandbox_options, backend_config
from adk_sandbox.executor.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("mapping", "typed"),
    [
        ({"type": "docker", "runtime": "runsc"}, DockerConfig(runtime="runsc")),
        (
            {"type": "kubernetes", "namespace": "evals", "context": "c"},
            KubernetesConfig(namespace="evals", context="c"),
        ),
        ({"type": "microvm", "accel": "tcg"}, MicroVMConfig(accel="tcg")),
        ({"type": "process"}, ProcessConfig()),
        ({"type": "bwrap", "workdir": "/srv"}, BwrapConfig(workdir="/srv")),
        ({"type": "wasm", "memory_limit_mb": 64}, WasmConfig(memory_limit_mb=64)),
    ],
)
def test_a_mapping_becomes_its_typed_config(mapping: dict[str, object], typed: BackendConfig) -> None:
    assert parse_config(mapping) == typed
    assert parse_config(typed) is typed
    assert typed.type == mapping["type"]  # every member keeps its own default type: DockerConfig() as before


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"type": "lxc"},
            "backend type 'lxc' is not one of docker, kubernetes, microvm, process, bwrap, wasm",
        ),
        ({"image": "x"}, "a backend config needs a 'type': one of docker,"),
        (
            {"type": "microvm", "runtime": "runsc"},
            "microvm backend config: runtime: Extra inputs are not permitted",
        ),
        ({"type": "docker", "memory": 1}, "docker backend config: memory: Extra inputs are not permitted"),
        ({"type": "microvm", "network": True}, "microvm backend config: network"),
        # A config file that still names the removed exec transport is told so, and what to do instead.
        ({"type": "docker", "transport": "exec"}, "transport='exec' was removed"),
        ({"type": "docker", "transport": "exec"}, "drop the transport argument"),
    ],
)
def test_a_config_the_union_cannot_take_is_refused_in_words(mapping: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make_backend(mapping)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _sandbox_options(parser, image_help="image")
    return parser.parse_args(argv)


def test_the_cli_flags_go_to_the_chosen_backend_or_are_refused() -> None:
    config = backend_config(_args("--backend", "microvm", "--memory", "256", "--image", "x/y:1"))
    assert isinstance(config, MicroVMConfig)
    assert (config.image, config.limits.memory_mb) == ("x/y:1", 256)
    with pytest.raises(InvalidRequestError, match="microvm backend config: runtime: Extra inputs are not"):
        backend_config(_args("--backend", "microvm", "--runtime", "runsc"))
    with pytest.raises(InvalidRequestError, match="process backend config: image: Extra inputs are not"):
        backend_config(_args("--backend", "process", "--image", "x"))
    bwrap = backend_config(_args("--backend", "bwrap"), workdir="/srv/ws")
    assert isinstance(bwrap, BwrapConfig) and bwrap.workdir == "/srv/ws"
    assert [(p.path, p.mode) for p in bwrap.policy.allowed_paths] == [("/srv/ws", "read_write")]


def test_the_inspect_providers_backend_key() -> None:
    inspect_sandbox = pytest.importorskip("adk_sandbox.devtools.adapters.inspect_sandbox")
    config = inspect_sandbox.AdkSandboxConfig(
        backend={"type": "kubernetes", "namespace": "evals"}, image="t:1"
    )
    made = config.backend_config()
    assert isinstance(made, KubernetesConfig) and (made.namespace, made.image) == ("evals", "t:1")
    assert inspect_sandbox.AdkSandboxConfig().backend_config() is None  # Docker: its fields as ever
    with pytest.raises(ValidationError, match="runtime: Docker settings, which the microvm backend has not"):
        inspect_sandbox.AdkSandboxConfig(backend="microvm", runtime="runsc")
    with pytest.raises(ValidationError, match="microvm backend config: acel: Extra inputs"):
        inspect_sandbox.AdkSandboxConfig(backend={"type": "microvm", "acel": "kvm"})


def test_the_union_loads_without_the_engines_clients() -> None:
    """DockerConfig, KubernetesConfig and the factory import no docker-py, kubernetes or wasmtime."""
    probe = (
        "import sys; import adk_sandbox.executor.backends.factory as f; "
        "f.parse_config({'type': 'docker', 'runtime': 'runsc'}); "
        "print(sorted({'docker', 'kubernetes', 'wasmtime'} & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_the_providers_config_file_names_the_backend(tmp_path: Path) -> None:
    inspect_sandbox = pytest.importorskip("adk_sandbox.devtools.adapters.inspect_sandbox")
    path = tmp_path / "adk-sandbox.yaml"
    path.write_text(
        "backend: {type: microvm, accel: tcg}\nimage: my-task\nlimits: {memory_mb: 1024, cpus: 1}\n"
    )
    made = inspect_sandbox.resolve_config(str(path)).backend_config()
    assert isinstance(made, MicroVMConfig)
    assert (made.accel, made.image, made.limits.memory_mb, made.limits.cpus) == ("tcg", "my-task", 1024, 1)
