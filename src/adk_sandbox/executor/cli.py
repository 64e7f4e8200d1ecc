"""The ``adk-sandbox`` command (also ``python -m adk_sandbox``): run commands in hardened sandboxes.

``run`` runs a command in a per-session container with a workspace mounted, streaming its output and
exiting with its exit code (124 on timeout); ``doctor`` lists each backend available on this machine with
its isolation class and what it enforces; ``cleanup`` removes leaked sandbox containers; ``images build``
builds the sandbox images that are missing or outdated; ``shell`` opens a terminal in a new session (served
to ``attach`` from other terminals while it runs); ``attach SESSION`` opens one in a session another
process serves; ``images push --engine ENGINE`` copies them to
another engine (``docker save`` streamed into its load, no registry); ``snapshots ls|rm|reap`` lists and
removes session snapshots (docs/snapshots.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from adk_sandbox.executor.attach import AttachServer, RemoteTerminal
from adk_sandbox.executor.backend import SandboxBackend, SandboxSession, SessionBackend
from adk_sandbox.executor.backends.bwrap import get_enforcer
from adk_sandbox.executor.backends.docker.config import config_from_options
from adk_sandbox.executor.backends.docker.engine import Engine
from adk_sandbox.executor.backends.factory import BACKEND_TYPES, make_backend, parse_config
from adk_sandbox.executor.backends.process import ProcessBackend, find_system_python
from adk_sandbox.executor.errors import BackendUnavailableError, ExecutorError, InvalidRequestError
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.policy import AllowedPath, SandboxPolicy
from adk_sandbox.executor.terminal_relay import relay
from adk_sandbox.executor.types import Capabilities, ExecRequest, ExecResult, Language, Stream

__all__ = ["main"]

_FLAGS = ("timeout", "memory", "cpu", "pids", "network", "fs_read", "fs_write", "env")
_FACTS = ("host_filesystem", "host_environment", "host_programs")  # where commands run, not enforcement


def _describe(name: str, caps: Capabilities) -> str:
    enforced = [flag for flag in _FLAGS if getattr(caps, flag)]
    missing = [flag for flag in _FLAGS if not getattr(caps, flag)]
    sees = [fact for fact in _FACTS if getattr(caps, fact)]
    languages = ", ".join(lang.value for lang in caps.languages) or "none"
    return (
        f"{name:<16} {caps.isolation.value:<16} enforces: {', '.join(enforced) or 'nothing'}\n"
        f"{'':<16} {'':<16} not enforced: {', '.join(missing) or 'nothing'}\n"
        f"{'':<16} {'':<16} commands see: {', '.join(sees) or 'no host state'}\n"
        f"{'':<16} {'':<16} languages: {languages}"
    )


def doctor() -> int:
    """Print every backend with its isolation and what it enforces; exit 0 when the Docker backend works."""
    print(f"{'backend':<16} {'isolation':<16} details")
    print(_describe("process", ProcessBackend().capabilities()))
    try:
        enforcer = get_enforcer()
    except BackendUnavailableError as exc:
        print(f"{'process+bwrap':<16} {'unavailable':<16} {exc}")
    else:
        # The policy doctor reports is the strictest one bubblewrap can enforce.
        policy = SandboxPolicy(allow_process_spawn=True)
        print(_describe("process+bwrap", ProcessBackend.with_sandbox(enforcer, policy).capabilities()))
        print(f"{'':<16} {'':<16} network policy: {_bwrap_network_of()}")
    docker_works = _doctor_docker()
    _doctor_wasm()
    _doctor_microvm()
    return 0 if docker_works else 1


def engine_lines(engine: Engine, dialect: str, version: str = "") -> list[str]:
    """``doctor``'s lines: the engine (its address; local or remote) and its dialect (docker, podman)."""
    where = "local" if engine.local else "remote"
    kind = "tcp+TLS" if engine.tls_verify else engine.kind
    shown = f" {version}" if version else ""
    return [
        f"{'engine':<16} {kind:<16} {engine.describe()} ({where})",
        f"{'dialect':<16} {dialect:<16} {dialect}{shown}",
    ]


def _doctor_engine() -> None:
    """The engine the Docker backend would use and its dialect (or why it does not answer)."""
    from adk_sandbox.executor.backends.docker import connect, dialect_of, resolve_engine  # noqa: PLC0415 - docker-py loads lazily

    try:
        engine = resolve_engine()
    except ExecutorError as exc:
        print(f"{'engine':<16} {'unusable':<16} {_first_line(exc)}")
        return
    try:
        client = connect(timeout=10, engine=engine)
    except ExecutorError as exc:
        print(f"{'engine':<16} {'unreachable':<16} {engine.describe()}: {_first_line(exc)}")
        return
    try:
        dialect = dialect_of(client).value
        version = str(client.api.api_version)  # negotiated by connect()
        for line in engine_lines(engine, dialect, f"(API {version})"):
            print(line)
    except ExecutorError as exc:
        print(f"{'dialect':<16} {'unknown':<16} {_first_line(exc)}")
    finally:
        client.close()


def _doctor_docker() -> bool:
    """The engine, each runtime's real container (runc, runsc) and the images; True when runc works."""
    from adk_sandbox.executor.backends.docker import DockerBackend, images  # noqa: PLC0415 - docker-py loads lazily

    _doctor_engine()
    works = False
    for name, runtime in (("docker/runc", None), ("docker/runsc", "runsc")):
        try:
            with DockerBackend(runtime=runtime) as backend:
                capabilities = backend.capabilities()
                print(_describe(name, capabilities))
                print(f"{'':<16} {'':<16} channel: {_channel_of(capabilities.channel)}")
                workspace = capabilities.workspace
                if workspace == "auto":
                    # What "auto" picks for a directory of this machine: whether the engine sees its files.
                    with tempfile.TemporaryDirectory(prefix="adk-sandbox-doctor-") as scratch:
                        workspace = f"auto:{backend.capabilities(workspace=scratch).workspace}"
                print(f"{'':<16} {'':<16} workspace: {_workspace_of(workspace)}")
                print(f"{'':<16} {'':<16} profiles: hardened (default); task: {_task_profile_of(runtime)}")
                print(f"{'':<16} {'':<16} network policy: {_proxy_of(backend.proxy_offered)}")
            works = works or runtime is None
        except ExecutorError as exc:
            print(f"{name:<16} {'unavailable':<16} {_first_line(exc)}")
    try:
        statuses = images.check_images()
    except ExecutorError as exc:
        print(f"{'images':<16} {'unknown':<16} {_first_line(exc)}")
        return False
    for status in statuses:
        print(f"{'image ' + status.name:<16} {status.state:<16} {status.tag} ({status.detail})")
    return works


def _task_profile_of(runtime: str | None) -> str:
    """Whether ``profile="task"`` works on this engine and runtime, and how its root writes are capped."""
    from adk_sandbox.executor.backends.docker import DockerBackend  # noqa: PLC0415 - docker-py loads lazily

    try:
        with DockerBackend(runtime=runtime, profile="task") as backend:
            cap = backend.root_cap
    except ExecutorError as exc:
        return f"refused ({_first_line(exc)})"
    how = {"memory": "held in memory, within the memory limit", "quota": "an engine storage quota",
           "watched": "the session stops once its layer passes the cap"}  # fmt: skip
    return f"root writes capped at {cap[1]} MiB: {how[cap[0]]}" if cap else "unavailable"


def _bwrap_network_of() -> str:
    """Whether bubblewrap commands can have a NetworkPolicy: its forwarder needs the system's Python."""
    python = find_system_python()
    if python is None:
        return "no (no system Python 3.8+ under /usr to run the in-namespace forwarder: refused)"
    return f"yes (network=NetworkPolicy; the in-namespace forwarder runs on {python}; docs/network.md)"


def _proxy_of(offered: bool | None) -> str:
    """Whether the agent serves the proxy endpoint a NetworkPolicy needs (``--allow-host``): doctor."""
    if offered:
        return "yes (the agent serves the proxy endpoint; --allow-host, network=NetworkPolicy)"
    return "no (the agent does not serve the proxy endpoint: a NetworkPolicy is refused)"


def _channel_of(channel: str | None) -> str:
    """How commands reach a Docker session's container (as its capabilities say), as ``doctor`` reports it."""
    if channel == "agent":
        return "agent (one long-lived in-sandbox agent per session, protocol 1, over one exec stream)"
    return str(channel)  # a Docker session has no other channel since the exec transport was removed


def _workspace_of(workspace: str | None) -> str:
    """How a workspace reaches a Docker session's container (as its capabilities say), for ``doctor``."""
    mode = workspace.removeprefix("auto:") if workspace else workspace
    if mode == "mirror":
        said = "mirror (a size-capped copy at the same path, synced before and after each command)"
    else:
        said = "bind (the host directory mounted at its own path, identity-checked at start)"
    if workspace and workspace.startswith("auto:"):
        return f"auto, decided per workspace; a fresh temporary directory here: {said}"
    return said


def _doctor_wasm() -> None:
    try:
        from adk_sandbox.executor.backends.wasm import WasmBackend  # noqa: PLC0415 - optional extra "wasm"
    except ImportError as exc:
        print(f"{'wasm':<16} {'unavailable':<16} {exc} (pip install 'adk-sandbox[wasm]')")
        return
    try:
        with WasmBackend() as backend:
            print(_describe("wasm", backend.capabilities()))
    except ExecutorError as exc:
        print(f"{'wasm':<16} {'unavailable':<16} {_first_line(exc)}")


def _doctor_microvm() -> None:
    """A real microVM's capabilities, and plainly whether it runs under KVM or the slow TCG emulation."""
    from adk_sandbox.executor.backends.microvm import MicroVMBackend  # noqa: PLC0415 - boots only here

    try:
        with MicroVMBackend() as backend:
            capabilities = backend.capabilities()
    except ExecutorError as exc:
        print(f"{'microvm':<16} {'unavailable':<16} {_first_line(exc)}")
        return
    print(_describe("microvm", capabilities))
    accel = (
        "kvm (hardware virtualisation)"
        if capabilities.accel == "kvm"
        else "tcg: KVM does not work here, so the VM is EMULATED: boots take seconds and guest code runs "
        "5-15x slower than native"
    )
    print(f"{'':<16} {'':<16} accel: {accel}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


#: Exit status of ``run`` when the command timed out (as GNU timeout) or hit the OOM; 128+N after signal N.
EXIT_TIMEOUT = 124
EXIT_OOM = 137
EXAMPLE_WORKSPACE = Path(__file__).parent / "example_workspace"
EXAMPLE_COMMAND = ("sh", "demo.sh")


def run(args: argparse.Namespace) -> int:
    """``adk-sandbox run``: one command in a per-session sandbox of ``--backend``, output streamed live."""
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    with contextlib.ExitStack() as stack:
        workspace = args.workspace
        if workspace is None and args.container is None and not command:
            workspace = stack.enter_context(_example_workspace())
            command = list(EXAMPLE_COMMAND)
        if not command:
            raise InvalidRequestError("no command given: adk-sandbox run [options] -- CMD [ARGS...]")
        backend = stack.enter_context(
            make_backend(backend_config(args, container=args.container, workdir=workspace))
        )
        sandbox: SandboxBackend | SandboxSession = backend
        if isinstance(backend, SessionBackend):
            sandbox = stack.enter_context(backend.session(workspace=workspace))
        _publish(sandbox, args.publish or [])
        request = ExecRequest(
            language=Language.COMMAND,
            code=shlex.join(command) if len(command) > 1 else command[0],
            timeout=args.timeout,
            max_output_bytes=args.max_output_bytes,
        )
        cancel = threading.Event()
        received: list[int] = []

        def stop(signum: int, _frame: object) -> None:
            received.append(signum)
            cancel.set()  # the session kills the command's whole tree in the sandbox

        # Ctrl-C or a CI job's SIGTERM must not leave the command running in the sandbox.
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            result = sandbox.execute(request, _stream_to_terminal, cancel=cancel)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if result.cancelled and received:
            print("adk-sandbox: interrupted; killed", file=sys.stderr)
            return 128 + received[0]
        return _report(result)
    return 1  # pragma: no cover - unreachable


def shell(args: argparse.Namespace) -> int:
    """``adk-sandbox shell``: a terminal in a new session of ``--backend``, joined to this one.

    The session is served to ``adk-sandbox attach`` while the shell runs (said on stderr); with
    ``--session ID`` this attaches to a session another process serves instead.
    """
    command = _command_of(args.cmd)
    if args.session is not None:
        return _attach(args.session, command, raw=args.raw)
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(make_backend(backend_config(args, workdir=args.workspace)))
        sandbox: Any = backend
        if isinstance(backend, SessionBackend):
            sandbox = stack.enter_context(backend.session(workspace=args.workspace))
        if getattr(sandbox, "open_pty", None) is None:
            raise InvalidRequestError(f"the {backend.name} backend opens no terminals")
        _publish(sandbox, args.publish or [])
        if isinstance(getattr(sandbox, "session_id", None), str):
            server = AttachServer(sandbox)
            stack.callback(server.close)
            print(f"adk-sandbox: session {sandbox.session_id}; from another terminal: {server.command}",
                  file=sys.stderr)  # fmt: skip
        rows, cols = _terminal_size()
        terminal = sandbox.open_pty(command or None, rows=rows, cols=cols)
        return relay(terminal, filtered=not args.raw)
    return 1  # pragma: no cover - unreachable


def attach(args: argparse.Namespace) -> int:
    """``adk-sandbox attach SESSION``: a terminal in a session another process serves."""
    return _attach(args.session, _command_of(args.cmd), raw=args.raw, user=args.user)


def _attach(session_id: str, command: list[str], *, raw: bool, user: str | None = None) -> int:
    rows, cols = _terminal_size()
    remote = RemoteTerminal(session_id, command or None, rows=rows, cols=cols, user=user)
    return relay(remote, filtered=not raw)


def _command_of(cmd: Sequence[str]) -> list[str]:
    command = list(cmd)
    return command[1:] if command[:1] == ["--"] else command


def _terminal_size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        return 24, 80
    return max(size.lines, 1), max(size.columns, 1)


def _publish(sandbox: SandboxBackend | SandboxSession, ports: list[str]) -> None:
    """``--publish [HOST:]PORT``: each port of the sandbox reached on the host's loopback (said on stderr)."""
    if not ports:
        return
    publish = getattr(sandbox, "publish", None)
    if publish is None:
        raise InvalidRequestError(
            "--publish needs a session on the agent channel (docker, kubernetes, microvm), not "
            f"{sandbox.name}"
        )
    for spec in ports:
        host, _, inside = spec.rpartition(":")
        if not inside.isdigit() or (host and not host.isdigit()):
            raise InvalidRequestError(f"--publish {spec!r}: give PORT or HOSTPORT:PORT (numbers)")
        address = publish(int(inside), int(host or 0))
        print(f"adk-sandbox: port {inside} of the sandbox is at http://{address}", file=sys.stderr)


def backend_config(
    args: argparse.Namespace, *, container: str | None = None, workdir: str | None = None
) -> Any:
    """The :data:`~.backends.factory.BackendConfig` of ``--backend``, ``--backend-config`` and the flags.

    The file's settings first, the flags over them; a flag the backend has no setting for is refused
    (``--runtime`` on a microVM: "microvm backend config: runtime: Extra inputs are not permitted").
    ``workdir`` (a host workspace) is where a process or bwrap backend's commands start (bwrap: allowed
    read-write).
    """
    settings: dict[str, Any] = _config_file(args.backend_config) if args.backend_config else {}
    kind = args.backend or settings.get("type") or "docker"
    if settings.setdefault("type", kind) != kind:
        raise InvalidRequestError(f"--backend {kind} but {args.backend_config} says type: {settings['type']}")
    limits = {k: v for k, v in {"memory_mb": args.memory, "cpus": args.cpus}.items() if v is not None}
    flags: dict[str, Any] = {
        "image": args.image,
        "runtime": args.runtime,
        "engine": args.engine,
        "tmpfs": _tmpfs_of(args.tmpfs) if args.tmpfs else None,
        "network": _network_of(args.allow_host or []),
        "container": container,
    }
    if limits:
        flags["limits"] = {**dict(settings.get("limits") or {}), **limits}
    given = {key: value for key, value in flags.items() if value is not None}
    if kind in ("process", "bwrap") and workdir is not None:
        given["workdir"] = os.path.abspath(workdir)
        if kind == "bwrap":
            policy = SandboxPolicy.model_validate(settings.get("policy") or {"allow_process_spawn": True})
            paths = (*policy.allowed_paths, AllowedPath(path=given["workdir"], mode="read_write"))
            given["policy"] = policy.model_copy(update={"allowed_paths": paths})
    if kind == "docker":
        return config_from_options({**{k: v for k, v in settings.items() if k != "type"}, **given})
    return parse_config({**settings, **given})


def _config_file(path: str) -> dict[str, Any]:
    """``--backend-config FILE``: a JSON mapping of a backend config's fields."""
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidRequestError(f"--backend-config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidRequestError(f"--backend-config {path} is not JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise InvalidRequestError(f"--backend-config {path} must hold a mapping of the backend's settings")
    return loaded


def _network_of(allowed: Sequence[str]) -> NetworkPolicy | None:
    """``--allow-host NAME[:PORT]`` options as a network policy (None without any: network none)."""
    if not allowed:
        return None
    try:
        return NetworkPolicy(allow=tuple(allowed))
    except ValidationError as exc:
        problems = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        raise InvalidRequestError(f"--allow-host: {problems}") from None


def _sandbox_options(parser: argparse.ArgumentParser, *, image_help: str) -> None:
    """The options of the sandbox container that ``run`` and ``mcp`` share (one place for their spelling)."""
    parser.add_argument(
        "--backend",
        choices=BACKEND_TYPES,
        help="the sandbox backend (default: docker, or the type in --backend-config); docs/GUIDE.md",
    )
    parser.add_argument(
        "--backend-config",
        metavar="FILE",
        help="the backend's settings: a JSON mapping of its config's fields (the flags override them)",
    )
    parser.add_argument("--image", metavar="IMG", help=image_help)
    parser.add_argument("--runtime", metavar="RUNTIME", help="container runtime, e.g. runsc (gVisor)")
    parser.add_argument("--memory", type=int, metavar="MB", help="memory limit (= memory+swap), MiB")
    parser.add_argument("--cpus", type=float, metavar="N", help="CPU limit in cores")
    parser.add_argument(
        "--tmpfs",
        action="append",
        metavar="PATH:MB",
        help="an extra writable tmpfs of MB MiB at PATH (exec,nosuid,nodev; repeatable), e.g. /var/tmp:64",
    )
    parser.add_argument(
        "--engine",
        metavar="ENGINE",
        help="the Docker engine: a URL (unix://, tcp://HOST:2376 with DOCKER_TLS_VERIFY/DOCKER_CERT_PATH, "
        "ssh://USER@HOST) or a Docker context name (default: what the docker CLI would use); a workspace "
        "travels to a remote engine as a mirror",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME[:PORT]",
        help="let commands reach NAME (a host name or *.suffix; without PORT: 80 and 443) through an HTTP "
        "proxy inside the sandbox, decided on this host; repeatable. The container keeps no route out "
        "(docs/network.md). Without it: no network",
    )


def _tmpfs_of(specs: Sequence[str]) -> dict[str, int]:
    """``--tmpfs PATH:MB`` options as a :class:`DockerBackend` ``tmpfs`` mapping (checked there)."""
    tmpfs: dict[str, int] = {}
    for spec in specs:
        path, _, size = spec.rpartition(":")
        if not path or not size.isdigit():
            raise InvalidRequestError(f"--tmpfs {spec!r} is not PATH:MB (e.g. --tmpfs /var/tmp:64)")
        if path in tmpfs:
            raise InvalidRequestError(f"--tmpfs names {path} twice")
        tmpfs[path] = int(size)
    return tmpfs


def _stream_to_terminal(stream: Stream, chunk: str) -> None:
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.write(chunk)
    out.flush()


def _report(result: ExecResult) -> int:
    for name, truncated in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)):
        if truncated:
            print(f"adk-sandbox: {name} truncated (raise --max-output-bytes)", file=sys.stderr)
    if result.timed_out:
        print(f"adk-sandbox: timed out after {result.duration_ms / 1000:.1f} s; killed", file=sys.stderr)
        return EXIT_TIMEOUT
    if result.oom_killed:
        print("adk-sandbox: killed: out of memory (raise --memory)", file=sys.stderr)
        return EXIT_OOM
    return result.exit_code if result.exit_code is not None else 1


@contextlib.contextmanager
def _example_workspace() -> Iterator[str]:
    """A fresh copy of the bundled example workspace (the container writes into it), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="adk-sandbox-example-") as scratch:
        root = os.path.join(scratch, "workspace")
        shutil.copytree(EXAMPLE_WORKSPACE, root, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"adk-sandbox: example workspace {root}", file=sys.stderr)
        yield root


def cleanup_pods(context: str | None, namespace: str) -> int:
    """``adk-sandbox cleanup --kubernetes``: delete the namespace's leaked session Pods (extra ``k8s``)."""
    from adk_sandbox.executor.backends.kubernetes import ClientApi, reap_leaked_pods  # noqa: PLC0415 - the k8s extra

    removed = reap_leaked_pods(ClientApi(context), namespace)
    for pod in removed:
        print(f"deleted Pod {namespace}/{pod.name}: {pod.reason}")
    print(f"{len(removed)} leaked Pod(s) deleted")
    return 0


def cleanup(session: str | None = None) -> int:
    """``adk-sandbox cleanup``: remove this project's leaked containers, or one session's (by label)."""
    from adk_sandbox.executor.backends.docker import cleanup_session, connect, reap_leaked  # noqa: PLC0415 - docker-py loads lazily

    if session is not None:
        ids = cleanup_session(session)
        for container_id in ids:
            print(f"removed {container_id[:12]} (session {session})")
        print(f"{len(ids)} container(s) of session {session} removed")
        return 0
    client = connect()
    try:
        removed = reap_leaked(client)
    finally:
        client.close()
    for container in removed:
        print(f"removed {container.name} ({container.id[:12]}): {container.reason}")
    print(f"{len(removed)} leaked container(s) removed")
    return 0


def snapshots_command(args: argparse.Namespace) -> int:
    """``adk-sandbox snapshots ls|rm|reap``: the snapshots on disk (and their root images)."""
    import time  # noqa: PLC0415

    from adk_sandbox.executor.snapshots.store import SnapshotStore  # noqa: PLC0415

    store = SnapshotStore(args.store)
    if args.snapshots_command == "ls":
        found = store.list()
        if args.json:
            print(json.dumps([snapshot.model_dump(mode="json") for snapshot in found], indent=1))
            return 0
        now = time.time()
        for snapshot in found:
            owner = snapshot.owner.get("io.adk-sandbox.owner-pid", "none (detached)")
            leaked = snapshot.leak_reason(now)
            print(
                f"{snapshot.id}  {snapshot.name}  {snapshot.size_bytes / (1 << 20):.1f} MiB  "
                f"{snapshot.method}  "
                f"root image: {(snapshot.root_image or 'none')[:19]}  owner pid: {owner}  "
                f"expires in {max(0, int(snapshot.expires - now))} s"
                + (f"  (leaked: {leaked})" if leaked else "")
            )
        print(f"{len(found)} snapshot(s) in {store.root}")
        return 0
    client = None
    try:
        if args.snapshots_command == "rm":
            chosen = [store.get(key) for key in args.snapshots]  # every one known before any is removed
            if any(snapshot.root_image for snapshot in chosen):
                client = _snapshot_engine()
            for snapshot in chosen:
                store.remove(snapshot, _image_remover(client))
                print(f"removed {snapshot.id} ({snapshot.name})")
            return 0
        client = _snapshot_engine()
        from adk_sandbox.executor.backends.docker import reap_snapshots  # noqa: PLC0415 - docker-py loads lazily

        removed = reap_snapshots(client, store)
        for line in removed:
            print(f"removed {line}")
        print(f"{len(removed)} leaked snapshot(s) or image(s) removed")
        return 0
    finally:
        if client is not None:
            client.close()


def _snapshot_engine() -> Any:
    from adk_sandbox.executor.backends.docker import connect  # noqa: PLC0415 - docker-py loads lazily

    return connect()


def _image_remover(client: Any) -> Any:
    if client is None:
        return None
    from adk_sandbox.executor.backends.docker import remove_snapshot_image  # noqa: PLC0415 - docker-py loads lazily

    return lambda image: remove_snapshot_image(client, image)


class _LiveDisplay:
    """Build progress: on a terminal one rewriting status line per build step, plain lines otherwise."""

    _STEP = re.compile(r"^(\S+): (Step \d+/\d+ : .*)$")

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.current = ""  # the key of the live line: "<image> Step n/m" or "<prefix>"
        self.label = ""  # what the live line shows before its latest output

    def line(self, text: str) -> None:
        if not self.live:
            print(text, file=self.out, flush=True)
            return
        if text.startswith("==> "):
            self._finish()
            print(text, file=self.out, flush=True)
            return
        step = self._STEP.match(text)
        prefix, _, rest = text.partition(": ")
        if step:
            self._finish()
            instruction = " ".join(step.group(2).split())
            if len(instruction) > 48:
                instruction = instruction[:47] + "\u2026"
            self.current, self.label = step.group(1) + step.group(2), f"  {step.group(1)} {instruction}"
            self._show(self.label)
        else:
            if not self.current.startswith(prefix):
                self._finish()
                self.current, self.label = prefix, f"  {prefix}"
            self._show(f"{self.label} | {rest.strip()}")

    def _show(self, text: str) -> None:
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        flat = " ".join(text.split())
        if len(flat) > width:
            flat = flat[: width - 1] + "\u2026"
        self.out.write(f"\r\x1b[K{flat}")
        self.out.flush()

    def _finish(self) -> None:
        """Leave the live line showing its step (not its last output) and move below it."""
        if self.current:
            self._show(self.label)
            self.out.write("\n")
            self.out.flush()
        self.current = self.label = ""

    def close(self) -> None:
        if self.live:
            self._finish()


def images_build(*, base_image: str | None, force: bool) -> int:
    """``adk-sandbox images build``: build what is missing or outdated, showing progress."""
    from adk_sandbox.executor.backends.docker.images import ImageBuildError, build_images  # noqa: PLC0415

    display = _LiveDisplay(sys.stdout)
    try:
        results = build_images(base_image=base_image, force=force, progress=display.line)
    except ImageBuildError as exc:
        display.close()
        if display.live and exc.output:
            print(exc.output, file=sys.stderr)
        print(f"adk-sandbox: error: {exc}", file=sys.stderr)
        return 1
    except ExecutorError as exc:
        display.close()
        print(f"adk-sandbox: error: {exc}", file=sys.stderr)
        return 1
    display.close()
    built = [r.tag for r in results if r.action == "built"]
    if built:
        print(f"built: {', '.join(built)}")
    else:
        print("all images up to date")
    return 0


def images_push(*, engine: str, names: Sequence[str]) -> int:
    """``adk-sandbox images push``: copy images to another engine, bytes sent shown; skip what it has."""
    from adk_sandbox.executor.backends.docker.images import push_images  # noqa: PLC0415

    display = _LiveDisplay(sys.stdout)
    try:
        results = push_images(engine, list(names) or None, progress=display.line)
    finally:
        display.close()
    pushed = [r.name for r in results if r.action != "up to date"]
    print(f"pushed: {', '.join(pushed)}" if pushed else "all images already there")
    return 0


def mcp_server(args: argparse.Namespace) -> int:
    """``adk-sandbox mcp``: serve the workspace tools to an MCP host over stdio (extra ``mcp``)."""
    try:
        from adk_sandbox.devtools.adapters import mcp  # noqa: PLC0415 - the mcp SDK is an optional extra
    except ImportError as exc:
        print(
            f"adk-sandbox: error: {exc}; install the extra: pip install 'adk-sandbox[mcp]'", file=sys.stderr
        )
        return 1
    if not os.path.isdir(args.workspace):
        print(f"adk-sandbox: error: --workspace {args.workspace!r} is not a directory", file=sys.stderr)
        return 2
    config = backend_config(args)  # checked even for --read-only, which starts no sandbox
    return mcp.main(args.workspace, config=config, read_only=args.read_only, code_exec=args.code_exec)


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911, PLR0915 - one return per command
    """Entry point of the ``adk-sandbox`` command."""
    parser = argparse.ArgumentParser(
        prog="adk-sandbox", description=__doc__.splitlines()[0] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run",
        help="run a command in a per-session hardened container",
        description="Run CMD in a per-session container (network off unless --allow-host names hosts, "
        "capabilities dropped, read-only root, limits) with DIR mounted read-write at the same path and "
        "as its cwd, as DIR's owner. Output is streamed live; the exit status is the command's (124 on "
        "timeout, 137 on OOM, 130 on Ctrl-C, 143 on SIGTERM). "
        "Without --workspace and --container, a bundled example workspace is used (and, without CMD, "
        "its demo).",
    )
    run_parser.add_argument("--workspace", metavar="DIR", help="directory to mount (default: the example)")
    _sandbox_options(run_parser, image_help="sandbox image")
    run_parser.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds (default 600)")
    run_parser.add_argument(
        "--max-output-bytes", type=int, default=64 * 1024 * 1024, metavar="N", help="per stream cap"
    )
    run_parser.add_argument(
        "--container", metavar="NAME", help="attach to this running container (e.g. the compose sandbox)"
    )
    run_parser.add_argument(
        "--publish",
        action="append",
        metavar="[HOST:]PORT",
        help="reach the sandbox's 127.0.0.1:PORT at 127.0.0.1:HOST on this machine while CMD runs (HOST "
        "omitted: a free port, printed); repeatable",
    )
    run_parser.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its args"
    )
    shell_parser = commands.add_parser(
        "shell",
        help="open a terminal in a new session (or, with --session, in one another process serves)",
        description="A terminal in a new session of --backend (bash, else sh; or CMD), joined to this "
        "one: every key goes to the sandbox, its size follows this terminal's. What the sandbox shows is "
        "filtered: control sequences that make a terminal answer, set its clipboard or title, or reach an "
        "outer terminal are not passed (--raw passes everything). While it runs the session is served "
        "to 'adk-sandbox attach ID' from other terminals of this user. The exit status is the program's.",
    )
    shell_parser.add_argument("--workspace", metavar="DIR", help="directory to mount (default: none)")
    shell_parser.add_argument("--session", metavar="ID", help="attach to this session instead (see attach)")
    _sandbox_options(shell_parser, image_help="sandbox image")
    shell_parser.add_argument(
        "--publish", action="append", metavar="[HOST:]PORT", help="as for run, while the shell runs"
    )
    shell_parser.add_argument("--raw", action="store_true", help="pass every byte, escape sequences too")
    shell_parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="instead of the shell")
    attach_parser = commands.add_parser(
        "attach",
        help="open a terminal in a session another process serves (adk-sandbox shell, an inspect eval)",
        description="A terminal in session ID, whose owner serves it to this user (adk-sandbox shell "
        "prints the command; an inspect eval's 'inspect sandbox connect' gives it). Filtered as shell's.",
    )
    attach_parser.add_argument("session", metavar="ID", help="the session's id")
    attach_parser.add_argument("--user", metavar="USER", help="run as USER (default: the session's user)")
    attach_parser.add_argument("--raw", action="store_true", help="pass every byte, escape sequences too")
    attach_parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="instead of the shell")
    commands.add_parser("doctor", help="list the backends available here and what each enforces")
    cleanup_parser = commands.add_parser(
        "cleanup",
        help="remove leaked sandbox containers (or one session's)",
        description="Remove this project's containers (selected by label, never by name) whose owner "
        "process is gone or whose expiry passed, and print what was removed. With --session, remove "
        "that session's containers instead, whoever owns them.",
    )
    cleanup_parser.add_argument(
        "--session", metavar="ID", help="remove the containers of this session id (DockerSession.session_id)"
    )
    cleanup_parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="delete leaked session Pods (owner gone or expired) instead of containers (extra k8s)",
    )
    cleanup_parser.add_argument("--context", metavar="CTX", help="with --kubernetes: the kubeconfig context")
    cleanup_parser.add_argument(
        "--namespace",
        default="default",
        metavar="NS",
        help="with --kubernetes: the namespace (default: default)",
    )
    images_parser = commands.add_parser(
        "images", help="the sandbox images (adk-sandbox/base, adk-sandbox/rust)"
    )
    images_commands = images_parser.add_subparsers(dest="images_command", required=True)
    build = images_commands.add_parser(
        "build",
        help="build the images that are missing or outdated",
        description="Build adk-sandbox/base and adk-sandbox/rust when missing or outdated (their build "
        "context changed). Without --base-image the Debian base is the bootstrap image, or "
        "debian:trixie-slim from a registry, or made with images/bootstrap (debootstrap) when no registry "
        "answers.",
    )
    build.add_argument("--base-image", metavar="IMG", help="the Debian image to build the base image on")
    build.add_argument("--force", action="store_true", help="rebuild every image, without the layer cache")
    push = images_commands.add_parser(
        "push",
        help="copy images to another Docker engine (no registry)",
        description="Stream `docker save` of each image from this machine's engine into the load of "
        "ENGINE, showing the bytes sent; an image ENGINE already has with the same id is skipped. Without "
        "IMAGE: adk-sandbox/base and adk-sandbox/rust.",
    )
    push.add_argument(
        "--engine",
        required=True,
        metavar="ENGINE",
        help="the target: a URL (tcp://HOST:2376 with DOCKER_TLS_VERIFY/DOCKER_CERT_PATH, ssh://USER@HOST) "
        "or a Docker context name",
    )
    push.add_argument("images", nargs="*", metavar="IMAGE", help="images to push (default: the project's)")
    mcp_parser = commands.add_parser(
        "mcp",
        help="serve the workspace tools to an MCP host over stdio",
        description="An MCP server on stdin/stdout: read_file, glob, grep, write_file, edit_file and bash "
        "on DIR, plus sandbox_exec (bash and sandbox_exec share one container with DIR mounted, removed "
        "when the client closes stdin or on SIGTERM). --read-only serves read_file, glob and grep only, "
        "with no container. Needs the extra: pip install 'adk-sandbox[mcp]'.",
    )
    mcp_parser.add_argument(
        "--workspace", required=True, metavar="DIR", help="the directory the tools work in"
    )
    _sandbox_options(mcp_parser, image_help="sandbox image for bash")
    mcp_parser.add_argument("--read-only", action="store_true", help="only read_file, glob and grep")
    mcp_parser.add_argument(
        "--code-exec", action="store_true", help="also serve code_exec (Rust, image adk-sandbox/rust)"
    )
    snapshots_parser = commands.add_parser(
        "snapshots",
        help="list or remove session snapshots (docs/snapshots.md)",
        description="The snapshots sessions took (session.snapshot(), session.fork()), kept in the cache "
        "directory with, under the task profile, an engine image of their root layer.",
    )
    snapshots_parser.add_argument(
        "--store", metavar="DIR", help="the snapshot store (default: snapshots in the cache directory)"
    )
    snapshots_commands = snapshots_parser.add_subparsers(dest="snapshots_command", required=True)
    snapshots_ls = snapshots_commands.add_parser("ls", help="list the snapshots, oldest first")
    snapshots_ls.add_argument("--json", action="store_true", help="print the records as JSON")
    snapshots_rm = snapshots_commands.add_parser(
        "rm", help="remove snapshots (directory and root image), by id or name"
    )
    snapshots_rm.add_argument("snapshots", nargs="+", metavar="ID", help="snapshot ids or names")
    snapshots_commands.add_parser(
        "reap", help="remove the snapshots whose owner process is gone or whose expiry passed"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "snapshots":
            return snapshots_command(args)
        if args.command == "mcp":
            return mcp_server(args)
        if args.command == "run":
            return run(args)
        if args.command == "shell":
            return shell(args)
        if args.command == "attach":
            return attach(args)
        if args.command == "doctor":
            return doctor()
        if args.command == "cleanup":
            if args.kubernetes:
                if args.session is not None:
                    raise InvalidRequestError("--session selects containers: not with --kubernetes")
                return cleanup_pods(args.context, args.namespace)
            return cleanup(args.session)
        if args.command == "images" and args.images_command == "push":
            return images_push(engine=args.engine, names=args.images)
        if args.command == "images":
            return images_build(base_image=args.base_image, force=args.force)
    except (ExecutorError, ValidationError) as exc:
        print(f"adk-sandbox: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidRequestError | ValidationError) else 1
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
