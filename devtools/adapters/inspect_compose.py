"""Single-service compose files, as written for inspect's docker provider, read into the provider's config.

``sandbox=("adk-sandbox", "compose.yaml")`` takes the file an eval already has for inspect's ``docker``
provider. Each key is either honoured or refused with an error naming it; none is ignored:

* ``image``; ``build`` (a context directory, or ``context``/``dockerfile``/``args``/``network``): built on
  the engine at task start and tagged ``image`` (or a name derived from the context);
* ``user``, ``working_dir``, ``environment`` (a mapping or ``KEY=VALUE`` list; a bare ``KEY`` takes the
  value of this process's environment, as compose does);
* ``mem_limit`` (``512m``, ``2g``, bytes), ``cpus``;
* ``network_mode: none`` (any other network is refused: for the names a task needs, give a network policy,
  ``x-adk-sandbox: {network: {allow: [pypi.org]}}``, which keeps ``none`` and proxies what it allows);
* ``init: true`` (every sandbox runs an init process; ``false`` cannot be honoured);
* ``command`` only when it keeps the container alive (``tail -f /dev/null``, ``sleep infinity``): the
  container's first process is the library's keeper, so a service command would never run;
* ``x-default``, ``x-local`` (images are never pulled), and ``x-adk-sandbox``: a mapping of
  :class:`AdkSandboxConfig` fields (``runtime: runsc``, ``profile``, ``limits``, ...) applied last.

Top level: ``services`` with exactly one service (several are refused until services get a private
network), plus ``name``, ``version`` and ``x-`` extension keys (YAML anchors), which change nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path
from typing import Any

__all__ = ["COMPOSE_KEYS", "built_name", "compose_fields", "dockerfile_fields", "is_compose", "is_dockerfile"]

#: The service keys read from a compose file (anything else is refused by name).
COMPOSE_KEYS = (
    "image",
    "build",
    "user",
    "working_dir",
    "environment",
    "init",
    "command",
    "mem_limit",
    "cpus",
    "network_mode",
    "x-default",
    "x-local",
    "x-adk-sandbox",
)
_TOP_LEVEL = ("services", "name", "version")
_BUILD_KEYS = ("context", "dockerfile", "args", "network")
_KEEP_ALIVE = re.compile(r"(tail -f /dev/null|sleep (infinity|inf|\d+))")
_SIZE = re.compile(r"(\d+)\s*([bkmg]?)b?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def is_compose(loaded: object) -> bool:
    """True for the contents of a compose file (a top-level ``services``)."""
    return isinstance(loaded, dict) and "services" in loaded


def is_dockerfile(path: Path) -> bool:
    """True for a Dockerfile's name (``Dockerfile``, ``Dockerfile.task``, ``task.Dockerfile``)."""
    return path.name == "Dockerfile" or path.name.startswith("Dockerfile.") or path.suffix == ".Dockerfile"


def dockerfile_fields(path: Path) -> dict[str, Any]:
    """The config of ``sandbox=("adk-sandbox", "Dockerfile")``: built from the file's directory.

    As inspect's docker provider does with a Dockerfile.
    """
    build = {"context": str(path.parent.resolve()), "dockerfile": path.name}
    return {"build": build, "image": built_name(build)}


def compose_fields(loaded: dict[str, Any], path: Path) -> dict[str, Any]:
    """The :class:`AdkSandboxConfig` fields a single-service compose file at ``path`` asks for.

    Raises ``ValueError`` naming the key (and the service) of anything that cannot be honoured.
    """
    where = f"compose file {str(path)!r}"
    unknown = [key for key in loaded if key not in _TOP_LEVEL and not str(key).startswith("x-")]
    if unknown:
        raise ValueError(
            f"{where}: adk-sandbox cannot honour the top-level key(s) {', '.join(map(repr, unknown))} "
            "(it reads `services` with one service; volumes, networks, secrets and configs are not supported)"
        )
    services = loaded["services"]
    if not isinstance(services, dict) or not services:
        raise ValueError(f"{where}: `services` must map one service name to its settings")
    if len(services) > 1:
        raise ValueError(
            f"{where} has {len(services)} services ({', '.join(map(str, services))}); adk-sandbox runs one "
            "service per sample until services get a private network of their own: keep the one the "
            "agent works in, or use inspect's docker provider for this task"
        )
    ((name, service),) = services.items()
    if not isinstance(service, dict):
        raise ValueError(f"{where}: service {name!r} must be a mapping of settings")
    return _service_fields(service, f"{where}, service {name!r}", path.parent)


def _service_fields(service: dict[str, Any], where: str, base: Path) -> dict[str, Any]:
    unknown = [key for key in service if key not in COMPOSE_KEYS]
    if unknown:
        raise ValueError(
            f"{where}: adk-sandbox cannot honour {', '.join(map(repr, unknown))} (it reads only "
            f"{', '.join(COMPOSE_KEYS)}; see docs/INTEGRATIONS.md, 'compose files')"
        )
    fields = _image(service, where, base)
    for key, field in (("user", "user"), ("working_dir", "working_dir")):
        if key in service:
            fields[field] = str(service[key])
    if "environment" in service:
        fields["env"] = _environment(service["environment"], where)
    if service.get("init", True) is not True:
        raise ValueError(f"{where}: `init: {service['init']}` cannot be honoured: every sandbox runs an init")
    if "command" in service:
        _keep_alive(service["command"], where)
    network = service.get("network_mode", "none")
    if network != "none":
        raise ValueError(
            f"{where}: `network_mode: {network}` cannot be honoured: a sandbox has no network "
            "(`network_mode: none`); set `x-adk-sandbox: {network: {allow: [NAME, ...]}}` for a policy "
            "allowing names, or `x-adk-sandbox: {network: true}` for the engine's bridge"
        )
    fields["network"] = False
    limits = _limits(service, where)
    if limits:
        fields["limits"] = limits
    extra = service.get("x-adk-sandbox") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: `x-adk-sandbox` must be a mapping of adk-sandbox config fields")
    if "limits" in extra and limits:
        extra = {**extra, "limits": {**limits, **extra["limits"]}}
    return {**fields, **extra}


def _image(service: dict[str, Any], where: str, base: Path) -> dict[str, Any]:
    if "build" in service:
        build = _build(service["build"], where, base)
        return {"build": build, "image": str(service.get("image") or built_name(build))}
    if "image" in service:
        return {"image": str(service["image"])}
    raise ValueError(f"{where}: needs `image` or `build`")


def _limits(service: dict[str, Any], where: str) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if "mem_limit" in service:
        limits["memory_mb"] = max(1, _bytes(service["mem_limit"], where) // (1024 * 1024))
    if "cpus" in service:
        limits["cpus"] = float(service["cpus"])
    return limits


def _build(build: object, where: str, base: Path) -> dict[str, Any]:
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise ValueError(f"{where}: `build` must be a context directory or a mapping")
    unknown = [key for key in build if key not in _BUILD_KEYS]
    if unknown:
        raise ValueError(
            f"{where}: adk-sandbox cannot honour build key(s) {', '.join(map(repr, unknown))} "
            f"(it reads {', '.join(_BUILD_KEYS)})"
        )
    context = (base / str(build.get("context", "."))).resolve()
    if not context.is_dir():
        raise ValueError(f"{where}: the build context {str(context)!r} is not a directory")
    result: dict[str, Any] = {"context": str(context)}
    if "dockerfile" in build:
        result["dockerfile"] = str(build["dockerfile"])
    if "args" in build:
        result["args"] = _environment(build["args"], f"{where}, build args")
    if "network" in build:
        result["network"] = str(build["network"])
    return result


def built_name(build: dict[str, Any]) -> str:
    """A stable local image name for a build without ``image`` (one per context and Dockerfile)."""
    key = f"{build['context']}\0{build.get('dockerfile', 'Dockerfile')}".encode()
    return f"adk-sandbox-task/{hashlib.sha256(key).hexdigest()[:16]}:latest"


def _environment(value: object, where: str) -> dict[str, str]:
    if isinstance(value, dict):
        items = [(str(key), None if found is None else str(found)) for key, found in value.items()]
    elif isinstance(value, list):
        items = []
        for entry in map(str, value):
            key, sep, found = entry.partition("=")
            items.append((key, found if sep else None))
    else:
        raise ValueError(f"{where}: `environment` must be a mapping or a list of KEY=VALUE")
    # A key without a value takes this process's value, and is left out when it has none (as compose).
    resolved = {key: found if found is not None else os.environ.get(key) for key, found in items}
    return {key: found for key, found in resolved.items() if found is not None}


def _keep_alive(command: object, where: str) -> None:
    text = shlex.join(map(str, command)) if isinstance(command, list) else str(command)
    words = " ".join(text.split())
    for prefix in ("sh -c ", "/bin/sh -c ", "bash -c "):
        if words.startswith(prefix):
            words = " ".join(shlex.split(words[len(prefix) :]))
    if not _KEEP_ALIVE.fullmatch(words):
        raise ValueError(
            f"{where}: `command: {text}` cannot be honoured: the container's first process is adk-sandbox's "
            "keeper, so a service command would never run (only keep-alive commands such as "
            "`tail -f /dev/null` are accepted); start the service from the task's setup instead"
        )


def _bytes(value: object, where: str) -> int:
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"{where}: `mem_limit: {value}` is not a size (for example 512m or 2g)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]
