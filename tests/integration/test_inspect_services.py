"""Several services of one sample (inspect's compose files), on runc and gVisor: linked by name, nothing else.

One sample per runtime, shared by the module: ``default`` (the base image), ``web``, whose command is a
small HTTP server on port 8000 that records each request's path, and ``api``, which has no ``command``: its
image's own ENTRYPOINT and CMD serve a file on port 8002, as ``docker compose up`` would run them. Every
container keeps network ``none``.
"""

from __future__ import annotations

import asyncio
import io
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml  # type: ignore[import-untyped]

from adk_sandbox.devtools.adapters import inspect_sandbox
from adk_sandbox.executor.backends.docker.images import BASE_IMAGE
from tests.conftest import require
from tests.loopback_server import LoopbackServer

#: An image whose own program is a server: ENTRYPOINT and CMD together, a file in its WORKDIR to serve.
API_IMAGE = "adk-sandbox-test/service-api:latest"
API_DOCKERFILE = f"""FROM {BASE_IMAGE}
USER root
RUN mkdir -p /srv/api && echo 'served by the image CMD' > /srv/api/hello.txt
ENTRYPOINT ["python3", "-m", "http.server"]
CMD ["8002", "--directory", "/srv/api"]
""".encode()

SERVER = textwrap.dedent("""\
    import http.server
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            open('/tmp/seen', 'a').write(self.path + '\\n')
            body = b'hello from web\\n'
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer(('0.0.0.0', 8000), H).serve_forever()
""")

FETCH = textwrap.dedent("""\
    import sys, urllib.request
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end='')
    except Exception as exc:
        print('FAILED', type(exc).__name__, exc)
""")

CONNECT = textwrap.dedent("""\
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).sendall(b'secret')
        print('CONNECTED')
    except OSError as exc:
        print('FAILED', exc)
""")


class Recorder(LoopbackServer):
    """A server on every address of this host: counts the bytes anyone sends it (a third party)."""

    def __init__(self) -> None:
        self.received = 0
        super().__init__("")

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                while data := conn.recv(4096):
                    self.received += len(data)
            except OSError:
                pass


def _host_address() -> str:
    """An address of this host other than loopback (where a bridge's gateway would lead)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "172.17.0.1"


class Sample:
    def __init__(self, runtime: str, tmp: Path) -> None:
        self.runtime = runtime
        compose = {
            "x-adk-sandbox": {
                "network": {"allow": ["allowed.test"]},
                "runtime": runtime,
                "profile": "hardened",
            },
            "services": {
                "default": {"image": BASE_IMAGE, "depends_on": ["web"]},
                "web": {"image": BASE_IMAGE, "command": ["python3", "-c", SERVER], "expose": [8000]},
                "api": {"image": API_IMAGE, "expose": [8002]},
            },
        }
        path = tmp / "compose.yaml"
        path.write_text(yaml.safe_dump(compose))
        self.config = str(path)
        self.task = f"services-{runtime}"
        cls = inspect_sandbox.AdkSandboxEnvironment
        asyncio.run(cls.task_init(self.task, self.config))
        self.envs: dict[str, Any] = asyncio.run(cls.sample_init(self.task, self.config, {}))

    def run(self, service: str, *argv: str) -> str:
        result = asyncio.run(self.envs[service].exec(list(argv), timeout=60))
        return str(result.stdout) + str(result.stderr)

    def close(self) -> None:
        cls = inspect_sandbox.AdkSandboxEnvironment
        asyncio.run(cls.sample_cleanup(self.task, self.config, self.envs, False))
        asyncio.run(cls.task_cleanup(self.task, self.config, True))


@pytest.fixture(scope="module", params=["runc", "runsc"])
def sample(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sample]:
    if request.param == "runsc":
        client = docker.from_env()
        require(
            "runsc" in (client.info().get("Runtimes") or {}), "gVisor (runsc) is not registered with Docker"
        )
    client = docker.from_env()
    client.images.build(fileobj=io.BytesIO(API_DOCKERFILE), tag=API_IMAGE, rm=True, network_mode="none")
    running = Sample(request.param, tmp_path_factory.mktemp(request.param))
    yield running
    running.close()


def test_the_sample_has_every_service_default_first(sample: Sample) -> None:
    assert next(iter(sample.envs)) == "default" and set(sample.envs) == {"default", "web", "api"}


def test_a_service_without_command_runs_its_images_entrypoint_and_cmd(sample: Sample) -> None:
    """Without the image's program nothing would listen on api:8002 (the container's first process is the
    keeper): the fetch would fail."""
    out = sample.run("default", "python3", "-c", FETCH, "http://api:8002/hello.txt")
    assert out == "served by the image CMD\n", out


def test_default_reaches_web_by_name_and_web_sees_it(sample: Sample) -> None:
    """Through default's proxy variables (a policy is in force): ``web`` is in NO_PROXY, so the request goes
    to default's listener on web's loopback address and is carried into web's sandbox."""
    out = sample.run("default", "python3", "-c", FETCH, f"http://web:8000/from-default-{sample.runtime}")
    assert out == "hello from web\n"
    seen = asyncio.run(sample.envs["web"].read_file("/tmp/seen"))
    assert f"/from-default-{sample.runtime}" in seen


def test_web_resolves_itself_and_not_a_port_it_does_not_expose(sample: Sample) -> None:
    """A naive design (a shared bridge network) would let ``default`` reach any port of ``web``: here only
    the exposed one is carried."""
    assert sample.run("web", "python3", "-c", FETCH, "http://web:8000/self") == "hello from web\n"
    out = sample.run("default", "python3", "-c", CONNECT, "web", "8001")
    assert out.startswith("FAILED"), out


def test_default_cannot_reach_the_host_or_a_third_party(sample: Sample) -> None:
    """A naive design (services on a shared Docker bridge network) routes to the bridge's gateway, the host:
    the recorder listening on every address of the host would get the bytes. Here the sandbox has no route."""
    recorder = Recorder()
    try:
        for address in (_host_address(), "172.17.0.1"):
            out = sample.run("default", "python3", "-c", CONNECT, address, str(recorder.port))
            assert out.startswith("FAILED"), out
        assert recorder.received == 0
    finally:
        recorder.listener.close()


def test_a_name_neither_a_service_nor_allowed_fails(sample: Sample) -> None:
    """A naive design resolves names through the engine's DNS and connects; here a name that is no
    sibling goes to the policy's proxy, which refuses it (403), and has no address of its own."""
    out = sample.run("default", "python3", "-c", FETCH, "http://not-a-service.test:8000/")
    assert out.startswith("FAILED HTTPError") and "403" in out, out
    out = sample.run("default", "python3", "-c", CONNECT, "not-a-service.test", "8000")
    assert out.startswith("FAILED"), out


def test_snapshots_of_a_sample_of_several_services_are_refused(sample: Sample) -> None:
    """Its services are linked to each other's running sandboxes, which a snapshot does not carry."""
    from adk_sandbox.executor.errors import InvalidRequestError  # noqa: PLC0415

    default = sample.envs["default"].as_type(inspect_sandbox.AdkSandboxEnvironment)
    with pytest.raises(InvalidRequestError, match="several services"):
        asyncio.run(default.snapshot())
    assert sample.run("default", "true") == ""
