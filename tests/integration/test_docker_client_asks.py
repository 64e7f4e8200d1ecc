"""What client integrations (inspect_ai, google-adk, MCP) need of the Docker backend, on the real engine.

Extra writable tmpfs mounts, user labels, cleanup of one session by id or by label, background processes,
settings given as a ``DockerConfig``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, InvalidRequestError, Language
from adk_sandbox.executor.backends.docker import (
    DockerBackend,
    DockerConfig,
    DockerSession,
    cleanup_labelled,
    cleanup_session,
)
from tests.conftest import containers_mounting, require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

RUNTIMES = ["runc", "runsc"]


def run(session: DockerSession, code: str, timeout: float = 20, **kwargs: object):  # type: ignore[no-untyped-def]
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout, **kwargs))


def backend_for(runtime: str, **kwargs: object) -> DockerBackend:
    backend = DockerBackend(runtime=None if runtime == "runc" else runtime, **kwargs)  # type: ignore[arg-type]
    if runtime == "runsc":
        require("runsc" in (backend._client.info().get("Runtimes") or {}), "gVisor (runsc) is not registered")
    return backend


def adk(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adk_sandbox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- extra tmpfs mounts ------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_extra_tmpfs_is_writable_executable_bounded_and_never_set_id(
    runtime: str, owned_workspace: Path
) -> None:
    with backend_for(runtime, tmpfs={"/var/tmp": 8}) as backend, backend.session(owned_workspace) as session:
        inspect = backend._client.api.inspect_container(session.container_id)
        assert inspect["HostConfig"]["Tmpfs"]["/var/tmp"] == "rw,exec,nosuid,nodev,size=8m,mode=1777"
        # What inspect_ai does with it: copy a helper in and run it.
        helper = run(session, "printf '#!/bin/sh\\necho helper ran\\n' > /var/tmp/h && chmod +x /var/tmp/h "
                              "&& /var/tmp/h")  # fmt: skip
        assert (helper.exit_code, helper.stdout) == (0, "helper ran\n"), helper.stderr
        mounted = run(session, "grep ' /var/tmp ' /proc/mounts").stdout.split()
        options = set(mounted[3].split(","))
        assert mounted[2] == "tmpfs" and "noexec" not in options, mounted
        if runtime == "runc":  # gVisor's /proc/mounts does not list nosuid/nodev (the set-id check below)
            assert {"nosuid", "nodev"} <= options, mounted
        full = run(session, "dd if=/dev/zero of=/var/tmp/big bs=1M count=16 2>&1; echo rc=$?")
        assert "No space left on device" in full.stdout and "rc=0" not in full.stdout, full.stdout
        setid = run(session, "touch /var/tmp/s && chmod 4755 /var/tmp/s; echo rc=$?")
        assert "rc=0" not in setid.stdout, setid
        # The rest of the root filesystem stays read-only.
        assert run(session, "touch /var/cache/x; echo rc=$?").stdout.strip().endswith("rc=1")


def test_an_extra_tmpfs_may_not_hide_the_workspace_or_come_with_an_attached_container() -> None:
    workspace = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="adk-sandbox-test-"))
    try:
        with DockerBackend(tmpfs={"/var/tmp": 8}) as backend:
            with pytest.raises(InvalidRequestError, match="overlaps the host mount '/var/tmp/adk-sandbox"):
                backend.session(workspace)
            assert containers_mounting(backend._client, workspace) == []
    finally:
        workspace.rmdir()
    with pytest.raises(InvalidRequestError, match="attached container"):
        DockerBackend(tmpfs={"/var/tmp": 8}, container="some-service")
    with pytest.raises(InvalidRequestError, match="overlaps /proc"):
        DockerBackend(tmpfs={"/proc/x": 8})


def test_cli_run_takes_repeatable_tmpfs_options(owned_workspace: Path) -> None:
    done = adk(
        "run", "--workspace", str(owned_workspace), "--tmpfs", "/var/tmp:8", "--tmpfs", "/opt/cache:4",
        "--", "sh", "-c", "echo a > /var/tmp/a && echo b > /opt/cache/b && cat /var/tmp/a /opt/cache/b "
        "&& df -m /opt/cache | tail -1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["a", "b"]
    assert lines[2].split()[1] == "4"  # its size in MiB
    bad = adk("run", "--workspace", str(owned_workspace), "--tmpfs", "/var/tmp", "--", "true")
    assert bad.returncode == 2 and "is not PATH:MB" in bad.stderr


# -- user labels -------------------------------------------------------------------------------------


def test_user_labels_are_on_every_container_and_the_projects_own_stay(owned_workspace: Path) -> None:
    labels = {"org.example.eval": "run-7", "org.example.sample": "3"}
    with (
        DockerBackend(labels=labels) as backend,
        backend.session(owned_workspace) as first,
        backend.session() as second,
    ):
        for session in (first, second):
            found = backend._client.api.inspect_container(session.container_id)["Config"]["Labels"]
            assert {key: found[key] for key in labels} == labels
            assert found["io.adk-sandbox.project"] == "adk-sandbox"
            assert found["io.adk-sandbox.owner-pid"] == str(os.getpid())
        listed = backend._client.containers.list(sparse=True, filters={"label": "org.example.eval=run-7"})
        assert {c.id for c in listed} == {first.container_id, second.container_id}
    with pytest.raises(InvalidRequestError, match="project's namespace"):
        DockerBackend(labels={"io.adk-sandbox.session": "someone-elses"})
    with pytest.raises(InvalidRequestError, match="attached container"):
        DockerBackend(labels={"org.example.eval": "x"}, container="some-service")


# -- cleanup of one session by id --------------------------------------------------------------------


def test_cleanup_session_removes_that_sessions_containers_and_nothing_else(owned_workspace: Path) -> None:
    with DockerBackend() as backend, backend.session(owned_workspace) as mine, backend.session() as other:
        session_id = mine.session_id
        assert len(session_id) == 12 and session_id != other.session_id
        first = mine.container_id
        labels = backend._client.api.inspect_container(first)["Config"]["Labels"]
        assert labels["io.adk-sandbox.session"] == session_id
        # From another backend (as inspect's `cli_cleanup(id)` would, in another process).
        with DockerBackend() as elsewhere:
            assert elsewhere.cleanup(session_id) == [first]
            assert elsewhere.cleanup(session_id) == []  # nothing left: not an error
        assert containers_mounting(backend._client, owned_workspace) == []
        assert run(other, "echo alive").stdout == "alive\n"  # another session is untouched
        # The session itself carries on in a fresh container, under the same id.
        assert run(mine, "echo back").stdout == "back\n"
        assert mine.container_id != first and mine.restarts == 1 and mine.session_id == session_id
        replacement = backend._client.api.inspect_container(mine.container_id)
        assert replacement["Config"]["Labels"]["io.adk-sandbox.session"] == session_id
        done = adk("cleanup", "--session", session_id)
        assert done.returncode == 0, done.stderr
        assert f"1 container(s) of session {session_id} removed" in done.stdout
    with pytest.raises(InvalidRequestError, match="is not one this library makes"):
        cleanup_session("x" * 65)
    bad = adk("cleanup", "--session", "a b")
    assert bad.returncode == 2 and "is not one this library makes" in bad.stderr


def test_cleanup_labelled_removes_the_labelled_containers_by_id_name_or_all_and_nothing_else() -> None:
    run_label = {"org.example.test-run": uuid.uuid4().hex}
    with DockerBackend(labels=run_label) as backend, DockerBackend() as unlabelled:
        sessions = [backend.session() for _ in range(3)]
        ids = [session.container_id for session in sessions]
        other = unlabelled.session()
        other_id = other.container_id
        name = backend._client.api.inspect_container(ids[1])["Name"].lstrip("/")
        assert cleanup_labelled(run_label, match=ids[0][:12], client=backend._client) == [ids[0]]
        assert cleanup_labelled(run_label, match=name) == [ids[1]]  # its own connection
        assert cleanup_labelled(run_label, match=other_id[:12]) == []  # not labelled: untouched
        assert cleanup_labelled(run_label) == [ids[2]]
        assert cleanup_labelled(run_label) == []  # nothing left: not an error
        assert run(other, "echo alive").stdout == "alive\n"
        for session in sessions:
            session.close()  # their containers are gone already: closing is still fine
    with pytest.raises(InvalidRequestError, match="project's namespace"):
        cleanup_labelled({"io.adk-sandbox.project": "adk-sandbox"})
    with pytest.raises(InvalidRequestError, match="at least one label"):
        cleanup_labelled({})


# -- settings as a DockerConfig ----------------------------------------------------------------------


def test_a_config_makes_the_same_backend_as_the_keyword_options(owned_workspace: Path) -> None:
    labels = {"org.example.eval": "config-7"}
    config = DockerConfig(tmpfs={"/var/tmp": 8}, labels=labels, transport="agent", lifetime_seconds=3600)
    with DockerBackend(tmpfs={"/var/tmp": 8}, labels=labels, transport="agent", lifetime_seconds=3600) as kw:
        assert kw.config == config
    with DockerBackend(config=config) as backend, backend.session(owned_workspace) as session:
        assert backend.config is config
        assert (backend.tmpfs, backend.labels, backend.transport) == ({"/var/tmp": 8}, labels, "agent")
        assert session.channel == "agent"
        found = backend._client.api.inspect_container(session.container_id)
        assert {key: found["Config"]["Labels"][key] for key in labels} == labels
        assert run(session, "df -m /var/tmp | tail -1").stdout.split()[1] == "8"
        assert backend.session_by_id(session.session_id) is session
        assert backend.sessions() == (session,)
