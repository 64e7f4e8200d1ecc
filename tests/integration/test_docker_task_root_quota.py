"""The task profile's root cap on an engine whose data root is XFS (docs/docker/profiles.md).

Real engines: private ``dockerd`` s (:mod:`tests.integration.xfs_engine`) whose data root is an XFS
filesystem in a loop file, reached through ``engine=``; the shared engine is never touched. Images come in
as a minimal image cut from the base image (a few seconds).

* mounted with ``pquota``: overlay2 takes ``--storage-opt size=``, the backend picks the ``quota``; a disk
  bomb's writes fail at the cap (ENOSPC or EDQUOT) and the session goes on answering; the data root grows by
  no more than the cap and gets its space back when the session closes. Needs a kernel with XFS quotas
  (``CONFIG_XFS_QUOTA``): on one without, XFS cannot be mounted with ``pquota`` at all, and that test skips
  saying so (nothing to install makes it run there).
* mounted without it: ``docker info`` looks the same (overlay2 on xfs) but the engine refuses the option at
  create; the backend sees that when it is made and falls back to the watch, which still holds the cap.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator

import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language, SandboxFailedError
from adk_sandbox.executor.backends.docker import BASE_IMAGE, DockerBackend, DockerSession
from adk_sandbox.executor.backends.docker.engine import Engine
from tests.conftest import require
from tests.integration.private_engine import DOCKERD, PrivateEngineError
from tests.integration.xfs_engine import MKFS_XFS, XfsEngine, xfs_quota_in_kernel

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

PRIVATE_IMAGE = "adk-sandbox-private/minimal:test"
CAP_MB = 64
MIB = 1024 * 1024
#: What the filesystem may take beyond the cap for the layer's own directories, metadata and logs.
SLACK_MB = 16
#: Files of 16 MiB (each within the fsize limit) until the disk gives out, then how much got written.
DISK_BOMB = (
    "i=0; while head -c 16M /dev/zero > /bomb$i; do i=$((i+1)); [ $i -lt 40 ] || break; done 2>&1; "
    "echo written=$(cat /bomb* | wc -c)"
)


def _xfs_engine(pquota: bool) -> Iterator[XfsEngine]:
    require(os.geteuid() == 0 and os.access(DOCKERD, os.X_OK), f"a private dockerd needs root and {DOCKERD}")
    require(os.access(MKFS_XFS, os.X_OK) and shutil.which("losetup") is not None,
            "an XFS data root needs mkfs.xfs (xfsprogs: scripts/setup) and losetup")  # fmt: skip
    try:
        engine = XfsEngine(pquota=pquota)
    except PrivateEngineError as exc:
        require(False, f"no XFS loop filesystem here: {exc}")
        raise  # unreachable
    try:
        engine.start()
        engine.import_minimal_image(BASE_IMAGE, PRIVATE_IMAGE)
    except PrivateEngineError as exc:
        engine.destroy()
        require(False, f"the private Docker engine could not start on XFS: {exc}")
    try:
        yield engine
    finally:
        engine.destroy()
        assert engine.leftover_processes() == []
        assert not engine.mounted() and not engine.loop_attached()
        assert not engine.root.exists() and not engine.image_dir.exists()


@pytest.fixture(scope="module")
def quota_engine() -> Iterator[XfsEngine]:
    """A private engine on XFS mounted with project quotas (pquota)."""
    if xfs_quota_in_kernel() is False:
        pytest.skip("this kernel has no XFS quotas (no CONFIG_XFS_QUOTA): XFS cannot be mounted with pquota")
    yield from _xfs_engine(pquota=True)


@pytest.fixture(scope="module")
def plain_engine() -> Iterator[XfsEngine]:
    """A private engine on XFS mounted without project quotas."""
    yield from _xfs_engine(pquota=False)


def run(session: DockerSession, code: str, timeout: float = 60) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def backing_filesystem(engine: XfsEngine) -> str:
    client = engine.client()
    try:
        status = dict(client.info().get("DriverStatus") or [])
    finally:
        client.close()
    return str(status.get("Backing Filesystem"))


def test_a_quota_fails_writes_at_the_cap_and_the_session_goes_on(quota_engine: XfsEngine) -> None:
    assert backing_filesystem(quota_engine) == "xfs"
    backend = DockerBackend(PRIVATE_IMAGE, engine=Engine(host=quota_engine.host), profile="task",
                            root_size_mb=CAP_MB)  # fmt: skip
    with backend:
        assert backend.root_cap == ("quota", CAP_MB)
        assert quota_engine.containers() == []  # the probe made at construction is gone
        before = quota_engine.used_bytes()
        with backend.session() as session:
            container_id = session.container_id
            client = quota_engine.client()
            try:
                host_config = client.api.inspect_container(container_id)["HostConfig"]
            finally:
                client.close()
            assert host_config.get("StorageOpt") == {"size": f"{CAP_MB}M"}
            result = run(session, DISK_BOMB)
            assert re.search(r"No space left on device|Disk quota exceeded", result.stdout), result
            written = int(re.findall(r"written=(\d+)", result.stdout)[-1])
            assert (CAP_MB - 16) * MIB <= written <= CAP_MB * MIB, result.stdout
            grown = quota_engine.used_bytes() - before
            assert grown <= (CAP_MB + SLACK_MB) * MIB, f"the data root grew by {grown // MIB} MiB"
            # Not killed: the session answers, and room made inside is room again.
            assert run(session, "echo alive").stdout.strip() == "alive"
            again = run(session, "rm -f /bomb* && head -c 8M /dev/zero > /after && echo wrote")
            assert again.stdout.strip() == "wrote", again
        assert quota_engine.containers() == []  # the layer went with the container
        assert quota_engine.used_bytes() - before <= SLACK_MB * MIB


def test_xfs_without_pquota_refuses_the_size_and_the_backend_watches(plain_engine: XfsEngine) -> None:
    # What the engine does: docker info shows it as it shows a quota engine, and a create refuses the option.
    assert backing_filesystem(plain_engine) == "xfs"
    client = plain_engine.client()
    try:
        host_config = client.api.create_host_config(network_mode="none", storage_opt={"size": f"{CAP_MB}M"})
        with pytest.raises(docker.errors.APIError, match="pquota"):
            client.api.create_container(PRIVATE_IMAGE, ["true"], host_config=host_config)
    finally:
        client.close()
    assert plain_engine.containers() == []
    # So the backend watches instead, and sessions start (they failed at create when it chose the quota).
    backend = DockerBackend(PRIVATE_IMAGE, engine=Engine(host=plain_engine.host), profile="task",
                            root_size_mb=CAP_MB)  # fmt: skip
    with backend:
        assert backend.root_cap == ("watched", CAP_MB)
        assert plain_engine.containers() == []  # the probe was removed
        with backend.session() as session:
            assert run(session, "echo alive").stdout.strip() == "alive"
            with pytest.raises(SandboxFailedError, match="root_size_mb"):
                run(session, "i=0; while [ $i -lt 40 ]; do head -c 32M /dev/zero > /bomb$i || exit 3; "
                             "i=$((i+1)); done; sleep 5")  # fmt: skip
        assert plain_engine.containers() == []
