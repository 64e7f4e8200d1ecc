"""The Kubernetes backend on a real cluster (issue 34), side by side with what the cluster itself costs.

Run: KUBECONFIG=/var/tmp/adk-k8s/run/admin.kubeconfig .venv/bin/python bench/bench_k8s.py [--quick]
     [--context admin] [--repeat N] [--commands N] [--fleet K] [--fleet-parallel P] [--fleet-timeout S]
     [--guaranteed] [--only 1,2,3,4,5] [--acquires N] [--cprofile]
(the cluster of ../shared/k8s, or any whose nodes hold ``--image``; Pods use ``imagePullPolicy: Never``).

1. Session start to the first command (``with backend.session() as s: s.execute(true)``), p50/p90 over
   ``--repeat``, alternated with a bare Pod of the same image created through the API until its container
   runs (seen by a watch: the cluster's own cost) and with the session's own Pod spec (its network-off init
   container included) created the same way; then one session start split by timestamps (a watch on its
   Pod, and the backend's steps timed from outside).
2. Warm ``true`` over the agent channel (p50/p99 over ``--commands``) against ``kubectl exec POD -- true``
   and a one-shot websocket exec from the Python client into the same Pod, in the same loop.
3. The fleet: ``--fleet`` sessions opened at once from a thread pool of ``--fleet-parallel``, each running
   one ``true``: how many started, the errors, time until all were ready, the host memory per session, then
   all closed and their Pods looked for (by the ``io.adk-sandbox.session`` label) and the node's Pod
   processes counted until they are gone.
4. A child process opens 3 sessions and is SIGKILLed: its Pods are listed, then a new backend is made (its
   start reaps leaked Pods) and what is left is listed again.
5. The pool: ``session()`` from ``KubernetesBackend(pool=2)`` (a started Pod handed out, its agent pinged)
   over ``--acquires``, alternated with a cold session start to its first command.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile
import importlib
import io
import json
import os
import pstats
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from _timing import Row, Stats, load_note, markdown, parser, rss_kib

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor._owner import PROJECT_LABEL, SESSION, owner_labels
from adk_sandbox.executor.backends.kubernetes import KubernetesBackend, KubernetesConfig, KubernetesPoolConfig
from adk_sandbox.executor.backends.kubernetes._spec import CONTAINER_NAME, pod_name, pod_spec

DEFAULT_KUBECONFIG = "/var/tmp/adk-k8s/run/admin.kubeconfig"
TRUE = ExecRequest(language=Language.COMMAND, code="true", timeout=30)
PROJECT_SELECTOR = f"{PROJECT_LABEL}=adk-sandbox"
#: The label of the anchors' Pods (not the project's: the reaper leaves them, this script deletes them).
BENCH_LABEL = "adk-sandbox-bench"
NAMESPACE = "default"
#: A session Pod's name in an error's text (left out, so equal errors are counted together).
POD_NAME = re.compile(r"adk-sandbox-[0-9a-f]{12}")


# --- the cluster, through the plain client ---------------------------------------------------------------


class Cluster:
    """The anchors' side: the official client and kubectl, with no backend in between."""

    def __init__(self, context: str, image: str) -> None:
        import kubernetes  # noqa: PLC0415 - the optional k8s extra

        self.context = context
        self.image = image
        self._kubernetes = kubernetes
        self.core: Any = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(context=context)
        )
        # stream() swaps its ApiClient's call_api while it connects: exec gets a client of its own.
        self.exec_core: Any = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(context=context)
        )

    def bare_pod(self, name: str) -> dict[str, Any]:
        """The smallest Pod of the image: one container sleeping, requests as small as the sessions'."""
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {BENCH_LABEL: "anchor"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "containers": [
                    {
                        "name": CONTAINER_NAME,
                        "image": self.image,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                    }
                ],
            },
        }

    def run_pod(self, pod: dict[str, Any], marks: dict[str, float] | None = None) -> float:
        """Seconds from the POST of ``pod`` until a watch sees its container running.

        ``marks`` gets the seconds (from the POST) at which the watch first saw it scheduled, its init
        containers done and its container running.
        """
        started = time.perf_counter()
        created = self.core.create_namespaced_pod(NAMESPACE, pod)
        if marks is not None:
            marks["POST returned"] = time.perf_counter() - started
        seen = self.watch_pod(created.metadata.name, created.metadata.resource_version, started, marks)
        return seen

    def watch_pod(
        self, name: str, resource_version: str, started: float, marks: dict[str, float] | None
    ) -> float:
        """Seconds (from ``started``) until the Pod's container runs, watched from ``resource_version``."""
        watch = self._kubernetes.watch.Watch()
        for event in watch.stream(
            self.core.list_namespaced_pod,
            NAMESPACE,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=300,
        ):
            now = time.perf_counter() - started
            if marks is not None:
                record_pod_marks(event["object"], now, marks)
            if pod_running(event["object"]):
                watch.stop()
                return now
        raise RuntimeError(f"the Pod {name} did not run within 300 s")

    def delete_pod(self, name: str) -> None:
        """Delete at once (grace 0); gone already is fine."""
        with contextlib.suppress(self._kubernetes.client.exceptions.ApiException):
            self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

    def delete_anchors(self) -> None:
        """Every Pod this script created as an anchor."""
        for pod in self.core.list_namespaced_pod(NAMESPACE, label_selector=BENCH_LABEL).items:
            self.delete_pod(pod.metadata.name)

    def session_pods(self, session_ids: set[str] | None = None) -> list[str]:
        """Names of the project's Pods in the namespace (of those sessions, if given)."""
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=PROJECT_SELECTOR).items
        return [
            pod.metadata.name
            for pod in pods
            if session_ids is None or (pod.metadata.labels or {}).get(SESSION) in session_ids
        ]

    def list_version(self, selector: str) -> str:
        """The resourceVersion to watch ``selector`` 's Pods from (nothing before it is missed)."""
        return str(
            self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).metadata.resource_version
        )

    def python_exec(self, pod: str) -> None:
        """``true`` in the Pod through one websocket exec of the Python client (what the backend rides on)."""
        from kubernetes.stream import stream  # noqa: PLC0415

        stream(
            self.exec_core.connect_get_namespaced_pod_exec,
            pod,
            NAMESPACE,
            container=CONTAINER_NAME,
            command=["true"],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )

    def kubectl_exec(self, pod: str) -> None:
        """``kubectl exec POD -- true``."""
        subprocess.run(
            [
                "kubectl",
                "--context",
                self.context,
                "exec",
                "-n",
                NAMESPACE,
                pod,
                "-c",
                CONTAINER_NAME,
                "--",
                "true",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )


def pod_running(pod: Any) -> bool:
    """The Pod's phase is Running and its sandbox container runs (what the backend waits for)."""
    status = pod.status
    return bool(
        status is not None
        and status.phase == "Running"
        and any(
            s.name == CONTAINER_NAME and s.state and s.state.running for s in status.container_statuses or []
        )
    )


def record_pod_marks(pod: Any, now: float, marks: dict[str, float]) -> None:
    """The first time a watch saw the Pod scheduled, its init containers done, its container running."""
    status = pod.status
    marks.setdefault("watch: seen", now)
    if pod.spec is not None and pod.spec.node_name:
        marks.setdefault("watch: scheduled", now)
    inits = (status.init_container_statuses if status is not None else None) or []
    if inits and all(s.state and s.state.terminated for s in inits):
        marks.setdefault("watch: init container done", now)
    if pod_running(pod):
        marks.setdefault("watch: container running", now)


# --- the node's processes --------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def node_processes() -> dict[str, tuple[int, int, int]]:
    """Per kind of cluster process: (count, RSS KiB, PSS KiB), from /proc.

    ``pods``: processes in a ``kubepods`` cgroup (each Pod's ``pause`` and its ``sleep`` keeper, the
    agent and the commands); ``shims``: the cluster containerd's ``containerd-shim`` processes (namespace
    ``k8s.io``); ``control``: etcd, the API server, controller manager, scheduler, kubelet and the
    cluster's containerd (command lines under /var/tmp/adk-k8s).
    """
    found: dict[str, list[int]] = {"pods": [0, 0, 0], "shims": [0, 0, 0], "control": [0, 0, 0]}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmdline = _read(f"/proc/{entry}/cmdline").replace("\0", " ")
        if not cmdline:
            continue  # a kernel thread, or gone
        if "kubepods" in _read(f"/proc/{entry}/cgroup"):
            kind = "pods"
        elif "containerd-shim" in cmdline and "k8s.io" in cmdline:
            kind = "shims"
        elif "/var/tmp/adk-k8s" in cmdline and "containerd-shim" not in cmdline:
            kind = "control"
        else:
            continue
        rollup = _read(f"/proc/{entry}/smaps_rollup")
        totals = found[kind]
        totals[0] += 1
        totals[1] += _kib(rollup, "Rss:")
        totals[2] += _kib(rollup, "Pss:")
    return {kind: (v[0], v[1], v[2]) for kind, v in found.items()}


def mem_available_kib() -> int:
    """MemAvailable of /proc/meminfo."""
    return _kib(_read("/proc/meminfo"), "MemAvailable:")


def kubepods_memory_kib() -> int:
    """The kubepods memory cgroup's usage (cgroup v1: RSS, page cache and the Pods' tmpfs), KiB."""
    usage = _read("/sys/fs/cgroup/memory/kubepods/memory.usage_in_bytes").strip()
    return int(usage) // 1024 if usage.isdigit() else 0


def wait_pod_processes(baseline: int, timeout: float) -> float | None:
    """Seconds until the node's kubepods processes are back to ``baseline`` (None: not within timeout)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if node_processes()["pods"][0] <= baseline:
            return time.perf_counter() - started
        time.sleep(0.2)
    return None


# --- helpers ---------------------------------------------------------------------------------------------


def spread(stats: Stats, unit: str = "s", scale: float = 1 / 1000) -> str:
    """p50 / p90 of millisecond samples, in seconds by default."""
    return f"p50 {stats.p50 * scale:.2f} / p90 {stats.p90 * scale:.2f} {unit}"


def short(exc: BaseException) -> str:
    """The error's class and its text, on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


# --- 1. session start ------------------------------------------------------------------------------------


def bench_start(
    backend: KubernetesBackend, open_backend: KubernetesBackend, cluster: Cluster, repeat: int
) -> tuple[list[Row], list[str]]:
    """Session start + first ``true`` alternated with a bare Pod and the session's Pod spec until Running.

    ``open_backend`` is the same config with ``network=True``: no network-off init container, no probe.
    """
    config = backend.config
    samples: dict[str, list[float]] = {"session": [], "open": [], "bare": [], "spec": []}
    closing: list[float] = []

    def session_sample(which: str, of: KubernetesBackend) -> None:
        started = time.perf_counter()
        session = of.session()
        session.start()
        assert session.execute(TRUE).exit_code == 0
        samples[which].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        session.close()
        closing.append((time.perf_counter() - started) * 1000)

    def bare_sample() -> None:
        name = f"adk-bench-bare-{uuid.uuid4().hex[:8]}"
        samples["bare"].append(cluster.run_pod(cluster.bare_pod(name)) * 1000)
        cluster.delete_pod(name)

    def spec_sample() -> None:
        session_id = uuid.uuid4().hex[:12]
        name = pod_name(session_id)
        pod = pod_spec(config, owner_labels(session_id, config.active_deadline_seconds), name)
        pod["metadata"]["labels"][BENCH_LABEL] = "anchor"
        samples["spec"].append(cluster.run_pod(pod) * 1000)
        cluster.delete_pod(name)

    order: list[Callable[[], None]] = [
        lambda: session_sample("session", backend),
        bare_sample,
        spec_sample,
        lambda: session_sample("open", open_backend),
    ]
    for fn in order:  # warm-up, untimed
        fn()
    for values in samples.values():
        values.clear()
    closing.clear()
    for i in range(repeat):
        for fn in order[i % 4 :] + order[: i % 4]:
            fn()
    session, opened, bare, spec = (Stats(tuple(samples[k])) for k in ("session", "open", "bare", "spec"))
    rows = [
        Row(
            "session start → first `true` (`session()`, `execute`)",
            spread(session),
            "a bare Pod of the image, POST → container running (watch)",
            spread(bare),
            session.p50 / bare.p50,
            "≤ 5 s p50",
            session.p50 <= 5000,
        ),
        Row(
            "the same session start",
            spread(session),
            "the session's own Pod spec (with its init container), POST → running",
            spread(spec),
            session.p50 / spec.p50,
        ),
        Row(
            "session start, `network=True` (no init container, no probe)",
            spread(opened),
            "the bare Pod",
            spread(bare),
            opened.p50 / bare.p50,
        ),
    ]
    notes = [
        f"session close (Pod deleted, grace 0) p50 {Stats(tuple(closing)).p50:.0f} ms; samples alternated, "
        f"{repeat} each, after one untimed round",
    ]
    return rows, notes


class Stamps:
    """Seconds since ``started`` at which wrapped calls began and returned, and the exec connects' times."""

    def __init__(self) -> None:
        self.started = 0.0
        self.marks: dict[str, float] = {}
        self.exec_opens: list[float] = []

    def stamp(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, marking when its first call began and when its last returned."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.marks.setdefault(f"{label} began", time.perf_counter() - self.started)
            try:
                return fn(*args, **kwargs)
            finally:
                self.marks[f"{label} returned"] = time.perf_counter() - self.started

        return wrapped

    def connects(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, each call's milliseconds kept (the session's exec websocket opens)."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.exec_opens.append((time.perf_counter() - began) * 1000)

        return wrapped


def profile_start(backend: KubernetesBackend, cluster: Cluster, use_cprofile: bool) -> list[str]:
    """One session start split by timestamps: a watch on its Pod, and the backend's steps timed outside."""
    module = importlib.import_module("adk_sandbox.executor.backends.kubernetes.backend")
    session = backend.session()
    stamps = Stamps()
    marks, exec_opens = stamps.marks, stamps.exec_opens
    selector = f"{SESSION}={session.session_id}"
    version = cluster.list_version(selector)
    watcher_marks: dict[str, float] = {}
    watch_started = threading.Event()

    def watch() -> None:
        watch_started.set()
        with contextlib.suppress(Exception):
            cluster.watch_pod(pod_name(session.session_id), version, stamps.started, watcher_marks)

    verify = module.verify_from_inside
    session_any: Any = session
    session_any._wait_running = stamps.stamp("wait for Running (polls every 0.25 s)", session._wait_running)
    session_any._probe_network = stamps.stamp("network probe", session._probe_network)
    session_any._open_stream = stamps.connects(session._open_stream)
    module.verify_from_inside = stamps.stamp("agent up (verify_from_inside)", verify)
    profiler = cProfile.Profile() if use_cprofile else None
    try:
        thread = threading.Thread(target=watch, daemon=True)
        stamps.started = time.perf_counter()
        thread.start()
        watch_started.wait()
        if profiler is not None:
            profiler.enable()
        session.start()
        marks["start() returned"] = time.perf_counter() - stamps.started
        assert session.execute(TRUE).exit_code == 0
        marks["first `true` returned"] = time.perf_counter() - stamps.started
        if profiler is not None:
            profiler.disable()
        thread.join(10)
    finally:
        module.verify_from_inside = verify
        session.close()
    timeline = sorted({**marks, **watcher_marks}.items(), key=lambda item: item[1])
    lines = [f"{label} {seconds:.2f} s" for label, seconds in timeline]
    notes = [
        "one session start, seconds from `start()`: " + "; ".join(lines),
        f"pods/exec websockets opened during it: {len(exec_opens)}, connect p50 "
        f"{Stats(tuple(exec_opens)).p50 if exec_opens else 0:.0f} ms, total {sum(exec_opens):.0f} ms",
    ]
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        notes.append(
            "cProfile of that start (main thread, by cumulative time):\n\n```\n" + out.getvalue() + "```"
        )
    return notes


# --- 2. per command --------------------------------------------------------------------------------------


def bench_commands(backend: KubernetesBackend, cluster: Cluster, commands: int, execs: int) -> list[Row]:
    """Warm ``true`` over the agent channel against kubectl exec and the client's exec, in one loop."""
    agent: list[float] = []
    kubectl: list[float] = []
    websocket: list[float] = []
    with backend.session() as session:
        session.execute(TRUE)
        pod = session.pod_name
        assert pod is not None
        cluster.kubectl_exec(pod)
        cluster.python_exec(pod)
        per_round = max(1, -(-commands // execs))
        for i in range(execs):
            for _ in range(per_round):
                started = time.perf_counter()
                assert session.execute(TRUE).exit_code == 0
                agent.append((time.perf_counter() - started) * 1000)
            for name, fn, into in (
                ("kubectl", cluster.kubectl_exec, kubectl),
                ("ws", cluster.python_exec, websocket),
            )[:: 1 if i % 2 else -1]:
                del name
                started = time.perf_counter()
                fn(pod)
                into.append((time.perf_counter() - started) * 1000)
    ours = Stats(tuple(agent))
    return [
        Row(
            f"warm `true` over the agent channel ({len(agent)})",
            f"p50 {ours.p50:.2f} / p99 {ours.p99:.2f} ms",
            f"`kubectl exec POD -- true` ({len(kubectl)})",
            f"p50 {Stats(tuple(kubectl)).p50:.1f} / p99 {Stats(tuple(kubectl)).p99:.1f} ms",
            ours.p50 / Stats(tuple(kubectl)).p50,
            "≤ 5 ms p50",
            ours.p50 <= 5,
        ),
        Row.latency(
            "the same",
            ours,
            f"one websocket exec of the Python client ({len(websocket)})",
            Stats(tuple(websocket)),
        ),
    ]


# --- 3. the fleet ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """The host's memory as the fleet part reads it, before and after."""

    nodes: dict[str, tuple[int, int, int]]
    this_rss: int
    available: int
    kubepods: int

    @classmethod
    def now(cls) -> Memory:
        """Read it now."""
        return cls(node_processes(), rss_kib(), mem_available_kib(), kubepods_memory_kib())


def memory_notes(before: Memory, after: Memory, per: int) -> tuple[str, str, str]:
    """Per session: Pod processes + shims PSS + this process's RSS; other readings; the whole growth."""

    def delta(kind: str, field: int) -> float:
        return (after.nodes[kind][field] - before.nodes[kind][field]) / 1024

    def growth(kind: str) -> str:
        pss = delta(kind, 2)
        return (
            f"{kind}: +{after.nodes[kind][0] - before.nodes[kind][0]} processes, PSS +{pss:.0f} MiB "
            f"({pss / per:.2f}/session), RSS +{delta(kind, 1):.0f} MiB"
        )

    this_rss = (after.this_rss - before.this_rss) / 1024
    available = (after.available - before.available) / 1024
    kubepods = (after.kubepods - before.kubepods) / 1024
    per_session = (delta("pods", 2) + delta("shims", 2) + this_rss) / per
    ours = f"{per_session:.2f} MiB (Pods' processes + shims PSS, + this process's RSS)"
    others = (
        f"MemAvailable {available / per:+.2f} MiB/session; kubepods cgroup +{kubepods / per:.2f} MiB/session"
    )
    whole = (
        "memory growth, all started sessions together (/proc smaps_rollup; PSS shares the pause and sleep "
        "binaries' pages out fairly): "
        + "; ".join(growth(kind) for kind in ("pods", "shims", "control"))
        + f" (control: etcd, API server, controller manager, scheduler, kubelet, containerd); this Python "
        f"process RSS +{this_rss:.0f} MiB ({this_rss / per:.2f}/session); MemAvailable {available:+.0f} MiB; "
        f"kubepods memory cgroup +{kubepods:.0f} MiB (with page cache and tmpfs)"
    )
    return ours, others, whole


def start_fleet(
    backend: KubernetesBackend, count: int, parallel: int
) -> tuple[list[Any], list[float], Counter[str]]:
    """``count`` sessions started ``parallel`` at a time, one ``true`` each: opened, seconds, errors."""
    opened: list[Any] = []
    ready: list[float] = []
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def start_one() -> None:
        session = backend.session()
        with lock:
            opened.append(session)
        began = time.perf_counter()
        try:
            assert session.execute(TRUE).exit_code == 0
        except Exception as exc:
            with lock:
                errors[POD_NAME.sub("adk-sandbox-…", short(exc))[:700]] += 1
            with contextlib.suppress(Exception):
                session.close()
            return
        with lock:
            ready.append(time.perf_counter() - began)

    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda _: start_one(), range(count)))
    return opened, ready, errors


def bench_fleet(
    config: KubernetesConfig, context: str, cluster: Cluster, count: int, parallel: int
) -> tuple[list[Row], list[str]]:
    """``count`` sessions started at once, kept idle, measured, closed; their Pods looked for."""
    backend = KubernetesBackend(config, context=context)
    before = Memory.now()
    began = time.perf_counter()
    opened, ready, errors = start_fleet(backend, count, parallel)
    all_ready = time.perf_counter() - began
    time.sleep(2)  # let the kubelet's last status updates and the shims settle
    after = Memory.now()
    started = len(ready)
    ids = {s.session_id for s in opened}
    listed_open = len(cluster.session_pods(ids))

    closing = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda s: s.close(), opened))
    backend.close()
    close_seconds = time.perf_counter() - closing
    left = cluster.session_pods(ids)
    gone = wait_pod_processes(before.nodes["pods"][0], 180)
    ours, others, whole = memory_notes(before, after, max(started, 1))
    each = Stats(tuple(ready or [0.0]))
    rows = [
        Row(
            f"{count} idle sessions at once ({parallel} starting at a time)",
            f"{started}/{count} started, all done in {all_ready:.1f} s; each p50 {each.p50:.1f} / p90 "
            f"{each.p90:.1f} s",
            "",
            "",
            target=f"{count} started",
            met=started == count,
        ),
        Row("host memory per started session", ours, "", others),
        Row(
            f"close all {len(opened)} ({parallel} at a time)",
            f"{close_seconds:.1f} s; session Pods left: {len(left)}",
            "",
            "the node's Pod processes gone after "
            + ("not within 180 s" if gone is None else f"{gone:.1f} s"),
            target="0 left",
            met=not left,
        ),
    ]
    requests = getattr(config, "requests", None)  # a revision before requests apart from limits has none
    asked = (
        "the limits (Guaranteed)"
        if requests is None
        else f"cpu {requests.cpus:g}, memory {requests.memory_mb} MiB"
    )
    notes = [
        f"fleet requests: {asked} (limits cpu {config.limits.cpus:g}, memory {config.limits.memory_mb} "
        f"MiB); startup_timeout_seconds {config.startup_timeout_seconds:g}; {listed_open} session Pods "
        "listed while open",
        whole,
    ]
    if errors:
        notes.append(
            f"{count - started} failed to start; their errors: "
            + " | ".join(f"{n}x {text}" for text, n in errors.most_common(5))
        )
    return rows, notes


# --- 4. SIGKILL of the owner -----------------------------------------------------------------------------


def child(context: str, image: str, sessions: int) -> None:
    """Open ``sessions`` sessions, print their Pods' names as one JSON line, then wait to be killed."""
    backend = KubernetesBackend(KubernetesConfig(image=image, image_pull_policy="Never"), context=context)
    opened = [backend.session() for _ in range(sessions)]
    for session in opened:
        session.execute(TRUE)
    print(json.dumps([s.pod_name for s in opened]), flush=True)
    time.sleep(3600)


def bench_sigkill(
    config: KubernetesConfig, context: str, cluster: Cluster, image: str
) -> tuple[list[Row], list[str]]:
    """A child with 3 sessions SIGKILLed; what a new backend's start-up reaper removes, and how fast."""
    baseline = node_processes()["pods"][0]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--context", context, "--image", image, "--child", "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    names = set(json.loads(line))
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.perf_counter()
    proc.wait()
    time.sleep(1)
    present = sorted(set(cluster.session_pods()) & names)
    made = time.perf_counter()
    backend = KubernetesBackend(config, context=context)
    made_seconds = time.perf_counter() - made
    reaped = [pod for pod in backend.reaped if pod.name in names]
    left = sorted(set(cluster.session_pods()) & names)
    gone_from_api = time.perf_counter() - killed
    backend.close()
    gone = wait_pod_processes(baseline, 120)
    rows = [
        Row(
            "owner SIGKILLed with 3 open sessions: its Pods 1 s later",
            f"{len(present)}/3 still there",
            "a new `KubernetesBackend(...)` (start-up reaper)",
            f"made in {made_seconds:.2f} s, deleted {len(reaped)}; left after: {len(left)}",
            target="0 left",
            met=not left,
        )
    ]
    notes = [
        f"reaper's reasons: {sorted({pod.reason for pod in reaped}) or 'none'}; the node's Pod processes "
        f"back to the baseline {'not within 120 s' if gone is None else f'{gone:.1f} s after the reap'}; "
        f"SIGKILL to Pods gone from the API: {gone_from_api:.1f} s (1 s of it the wait)",
    ]
    return rows, notes


# --- main ------------------------------------------------------------------------------------------------


def bench_pool(config: KubernetesConfig, context: str, acquires: int) -> tuple[list[Row], list[str]]:
    """``session()`` from a pool of started Pods, against a cold session start, alternated."""
    pooled: list[float] = []
    first: list[float] = []
    cold: list[float] = []
    with (
        KubernetesBackend(config, context=context, pool=KubernetesPoolConfig(size=2)) as backend,
        KubernetesBackend(config, context=context) as plain,
    ):
        assert backend.pool is not None
        for _ in range(acquires):
            backend.pool.wait_ready(120)
            started = time.perf_counter()
            session = backend.session()
            pooled.append((time.perf_counter() - started) * 1000)
            assert session.execute(TRUE).exit_code == 0
            first.append((time.perf_counter() - started) * 1000)
            session.close()
            started = time.perf_counter()
            with plain.session() as fresh:
                assert fresh.execute(TRUE).exit_code == 0
            cold.append((time.perf_counter() - started) * 1000)
        stats = backend.pool.stats()
    ours, anchor = Stats(tuple(pooled)), Stats(tuple(cold))
    return [
        Row(
            f"pool acquire: `session()` with `pool=2` ({len(pooled)})",
            f"p50 {ours.p50:.2f} / p99 {ours.p99:.2f} ms",
            "a cold session start → first `true`",
            f"p50 {anchor.p50:.0f} ms",
            ours.p50 / anchor.p50,
            "≤ 10 ms p50",
            ours.p50 <= 10,
        ),
    ], [f"acquire → first `true` p50 {Stats(tuple(first)).p50:.1f} ms; pool stats at the end: {stats}"]


def revision() -> str:
    """The checkout's commit, and whether its executor/ has changes not committed."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--", "../executor"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    import adk_sandbox  # noqa: PLC0415

    where = os.path.dirname(os.path.dirname(os.path.abspath(adk_sandbox.__file__)))
    return f"{head}{' + uncommitted changes in executor/' if dirty else ''} (imported from {where})"


@contextlib.contextmanager
def section(title: str) -> Iterator[None]:
    """Print the title and the load first; an error ends the section with its text, not the run."""
    print(f"### {title}\n\n{load_note()}\n", flush=True)
    try:
        yield
    except Exception as exc:
        print(f"**failed**: {short(exc)}\n", flush=True)


def arguments() -> argparse.Namespace:
    """The command line (``--quick`` scales the counts down)."""
    args = parser(__doc__)
    args.add_argument("--context", default="admin")
    args.add_argument("--image", default="adk-sandbox/base:latest")
    args.add_argument("--repeat", type=int, default=10, help="session starts (and each anchor)")
    args.add_argument("--commands", type=int, default=200, help="warm commands over the agent channel")
    args.add_argument("--execs", type=int, default=30, help="kubectl exec (and client exec) samples")
    args.add_argument("--fleet", type=int, default=100, help="sessions opened at once")
    args.add_argument("--fleet-parallel", type=int, default=8, help="sessions starting at a time")
    args.add_argument(
        "--fleet-timeout", type=float, default=60.0, help="startup_timeout_seconds of the fleet"
    )
    args.add_argument(
        "--guaranteed", action="store_true", help="the fleet requests its limits (requests=None)"
    )
    args.add_argument("--only", default="1,2,3,4,5", help="which parts, e.g. 1,3")
    args.add_argument("--acquires", type=int, default=10, help="sessions taken from the pool (part 5)")
    args.add_argument("--cprofile", action="store_true", help="also print a cProfile of one session start")
    args.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)  # part 4's owner
    options = args.parse_args()
    if options.quick:
        options.repeat, options.commands, options.execs = 3, 50, 10
        options.fleet = min(options.fleet, 10)
    return options


def print_part(rows: list[Row], notes: list[str]) -> None:
    """A part's table and its notes."""
    print(markdown(rows) + "\n\n" + "\n".join(f"* {n}" for n in notes) + "\n", flush=True)


def main() -> None:
    """Print the issue 34 tables."""
    options = arguments()
    os.environ.setdefault("KUBECONFIG", DEFAULT_KUBECONFIG)
    if options.child:
        child(options.context, options.image, options.child)
        return
    parts = {int(p) for p in options.only.split(",") if p}
    config = KubernetesConfig(image=options.image, image_pull_policy="Never")
    cluster = Cluster(options.context, options.image)
    print(f"## Issue 34: Kubernetes backend on a real cluster (bench/bench_k8s.py)\n\ncode: {revision()}\n")
    backend = KubernetesBackend(config, context=options.context)
    try:
        if 1 in parts:
            with section(f"Session start (repeat {options.repeat})"):
                open_backend = KubernetesBackend(
                    config.model_copy(update={"network": True}), context=options.context
                )
                try:
                    rows, notes = bench_start(backend, open_backend, cluster, options.repeat)
                finally:
                    open_backend.close()
                print_part(rows, notes + profile_start(backend, cluster, options.cprofile))
        if 2 in parts:
            with section("Per command"):
                print_part(bench_commands(backend, cluster, options.commands, options.execs), [])
        if 3 in parts:
            fleet_config = config.model_copy(
                update={"startup_timeout_seconds": options.fleet_timeout}
                | ({"requests": None} if options.guaranteed else {})
            )
            with section(f"Fleet of {options.fleet}"):
                print_part(
                    *bench_fleet(
                        fleet_config, options.context, cluster, options.fleet, options.fleet_parallel
                    )
                )
        if 4 in parts:
            with section("Owner SIGKILLed"):
                print_part(*bench_sigkill(config, options.context, cluster, options.image))
        if 5 in parts:
            with section(f"Pool acquire ({options.acquires})"):
                print_part(*bench_pool(config, options.context, options.acquires))
    finally:
        backend.close()
        cluster.delete_anchors()


if __name__ == "__main__":
    main()
