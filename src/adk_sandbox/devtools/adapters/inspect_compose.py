"""Compose files, as written for inspect's docker provider, read into the provider's config.

:func:`compose_fields` reads a single service into :class:`~.inspect_sandbox.AdkSandboxConfig` fields,
:func:`compose_services` every service (:class:`ComposeService`); each key is honoured or refused, never
ignored. See docs/INTEGRATIONS.md, section "inspect_ai", paragraphs "Compose files" and "Several services".
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPOSE_KEYS",
    "ComposeService",
    "built_name",
    "compose_fields",
    "compose_services",
    "dockerfile_fields",
    "is_compose",
    "is_dockerfile",
]

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
    "expose",
    "ports",
    "depends_on",
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


@dataclass(frozen=True)
class ComposeService:
    """One service of a compose file: its config fields and what links it to its siblings."""

    name: str
    fields: dict[str, Any]
    """The :class:`AdkSandboxConfig` fields of its sandbox."""
    command: tuple[str, ...] | None
    """Its program (started in the background at sample start); None for the default service."""
    ports: tuple[int, ...]
    """The ports its siblings reach it on (``expose``, the container side of ``ports``)."""
    depends_on: tuple[str, ...]
    default: bool


def compose_fields(loaded: dict[str, Any], path: Path) -> dict[str, Any]:
    """The :class:`AdkSandboxConfig` fields a single-service compose file at ``path`` asks for.

    Raises ``ValueError`` naming the key (and the service) of anything that cannot be honoured, and for a
    file of several services (:func:`compose_services` reads those).
    """
    services = compose_services(loaded, path)
    if len(services) > 1:
        raise ValueError(
            f"compose file {str(path)!r} has {len(services)} services: read it with compose_services"
        )
    return services[0].fields


def compose_services(loaded: dict[str, Any], path: Path) -> list[ComposeService]:
    """The services of a compose file at ``path``: the default one first, then in start-up order.

    The default service is the one named ``default``, else the one with ``x-default: true``, else the first
    (as inspect's docker provider). Raises ``ValueError`` naming the key (and the service) of anything
    that cannot be honoured: unknown keys, a ``depends_on`` on no service or in a cycle, a port exposed by
    two services.
    """
    where = f"compose file {str(path)!r}"
    unknown = [key for key in loaded if key not in _TOP_LEVEL and not str(key).startswith("x-")]
    if unknown:
        raise ValueError(
            f"{where}: adk-sandbox cannot honour the top-level key(s) {', '.join(map(repr, unknown))} "
            "(it reads `services`; volumes, networks, secrets and configs are not supported: services reach "
            "each other by name with no network of the engine's, see docs/network.md)"
        )
    services = loaded["services"]
    if not isinstance(services, dict) or not services:
        raise ValueError(f"{where}: `services` must map service names to their settings")
    common = loaded.get("x-adk-sandbox") or {}
    if not isinstance(common, dict):
        raise ValueError(
            f"{where}: the top-level `x-adk-sandbox` must be a mapping of adk-sandbox config fields"
        )
    names = [str(name) for name in services]
    default = _default_name(services, where)
    found: dict[str, ComposeService] = {}
    for name, service in services.items():
        at = f"{where}, service {name!r}"
        if not isinstance(service, dict):
            raise ValueError(f"{at} must be a mapping of settings")
        is_default = str(name) == default
        if common:
            own = service.get("x-adk-sandbox") or {}
            merged = {**common, **own} if isinstance(own, dict) else own  # not a mapping: refused below
            service = {**service, "x-adk-sandbox": merged}  # noqa: PLW2901 - the service as read
        command = service.get("command")
        if is_default or command is None:
            fields = _service_fields(service, at, path.parent)
            argv = None
        else:
            fields = _service_fields({k: v for k, v in service.items() if k != "command"}, at, path.parent)
            argv = _argv(command, at)
        found[str(name)] = ComposeService(
            name=str(name),
            fields=fields,
            command=argv,
            ports=_ports(service, at),
            depends_on=_depends_on(service.get("depends_on"), at, names),
            default=is_default,
        )
    owner: dict[int, str] = {}
    for service in found.values():
        for port in service.ports:
            if port in owner:
                raise ValueError(
                    f"{where}: services {owner[port]!r} and {service.name!r} both expose port {port}; "
                    "each port may be exposed by one service (siblings share one port space on their "
                    "loopback "
                    "addresses here, docs/network.md)"
                )
            owner[port] = service.name
    order = _start_order(found, where)
    return [found[default]] + [found[name] for name in order if name != default]


def _default_name(services: dict[str, Any], where: str) -> str:
    if "default" in services:
        return "default"
    marked = [
        str(name)
        for name, service in services.items()
        if isinstance(service, dict) and service.get("x-default")
    ]
    if len(marked) > 1:
        raise ValueError(f"{where}: more than one service has `x-default: true` ({', '.join(marked)})")
    return marked[0] if marked else str(next(iter(services)))


def _argv(command: object, where: str) -> tuple[str, ...]:
    if isinstance(command, list) and command and all(isinstance(word, (str, int, float)) for word in command):
        return tuple(map(str, command))
    if isinstance(command, str) and command.strip():
        return ("sh", "-c", command)
    raise ValueError(f"{where}: `command` must be a string or a non-empty list of words")


def _ports(service: dict[str, Any], where: str) -> tuple[int, ...]:
    """The container side of ``ports`` and every ``expose``.

    ``80``, ``"8080:80"``, ``"127.0.0.1:8080:80/tcp"``,
    ``{target: 80}``; a range or a UDP port is refused.
    """
    ports: list[int] = []
    for key in ("expose", "ports"):
        entries = service.get(key, [])
        if not isinstance(entries, list):
            raise ValueError(f"{where}: `{key}` must be a list")
        for entry in entries:
            if isinstance(entry, dict):
                unknown = [
                    k
                    for k in entry
                    if k not in ("target", "published", "protocol", "host_ip", "mode", "name")
                ]
                if unknown or entry.get("protocol", "tcp") != "tcp":
                    raise ValueError(
                        f"{where}: `{key}` entry {entry!r} cannot be honoured (a TCP `target` only)"
                    )
                text = str(entry.get("target", ""))
            else:
                text = str(entry)
                if text.endswith("/tcp"):
                    text = text[: -len("/tcp")]
                text = text.rsplit(":", 1)[-1]
            if not text.isdigit() or not 1 <= int(text) <= 65535:
                raise ValueError(
                    f"{where}: `{key}` entry {entry!r} cannot be honoured (one TCP port 1..65535; "
                    "ranges and UDP are not carried)"
                )
            if int(text) not in ports:
                ports.append(int(text))
    return tuple(ports)


def _depends_on(value: object, where: str, names: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        items: list[tuple[str, object]] = [(str(name), {}) for name in value]
    elif isinstance(value, dict):
        items = [(str(name), spec or {}) for name, spec in value.items()]
    else:
        raise ValueError(f"{where}: `depends_on` must be a list of services or a mapping")
    for name, spec in items:
        if name not in names:
            raise ValueError(f"{where}: `depends_on` names {name!r}, which is not a service of the file")
        if not isinstance(spec, dict) or any(key not in ("condition", "required") for key in spec):
            raise ValueError(f"{where}: `depends_on: {name}` reads only `condition` (and `required: true`)")
        if (
            spec.get("condition", "service_started") != "service_started"
            or spec.get("required", True) is not True
        ):
            raise ValueError(
                f"{where}: `depends_on: {name}: {spec}` cannot be honoured: only "
                "`condition: service_started` (there is no health check here; the provider waits until each "
                "service accepts on the ports "
                "it exposes)"
            )
    return tuple(name for name, _ in items)


def _start_order(services: dict[str, ComposeService], where: str) -> list[str]:
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"{where}: `depends_on` makes a cycle: {' -> '.join([*visiting, name])}")
        visiting.append(name)
        for other in services[name].depends_on:
            visit(other)
        visiting.pop()
        order.append(name)

    for name in services:
        visit(name)
    return order


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
    for key in ("expose", "ports", "depends_on"):
        service = {k: v for k, v in service.items() if k != key}  # read by compose_services
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
