"""The tools agents use, through a NetworkPolicy (issue 23, "Allowed"): pip, git, curl, urllib; runc, gVisor.

Each tool runs unmodified in a session built from a small image (:data:`PIP_IMAGE`: the bypass suite's curl
image plus Debian's ``python3-pip``) and reaches the host side only through the session's proxy variables.
The servers are static file servers on the host's loopback (:class:`StaticServer`), reached through
``hosts`` pins, over TLS with a certificate for every test name signed by a test CA. The sandbox trusts
that CA because the test writes it into the sandbox with the session's file operations and names it to
each tool (``--cert``, ``GIT_SSL_CAINFO``, ``--cacert``); the host side never terminates these tunnels (no
``headers``), so each tool verifies the real server itself.

* ``pip install`` from a PEP 503 index (``/simple/<name>/``) serving a wheel the test writes by hand;
* ``git clone`` over HTTPS from a bare repository served as static files (git's "dumb" HTTP protocol);
* a wildcard rule (``*.pkg.test:<port>``: ``files.pkg.test`` yes, ``pkg.test`` itself 403) and a port rule
  (``api.test:<port>``: another port of the same name 403, and that server sees nothing);
* curl and Python's ``urllib`` to an allowed HTTPS name and an allowed plain HTTP name.

Debian's pip refuses to install outside a virtual environment (PEP 668, ``EXTERNALLY-MANAGED``), for
``--user`` too: the test passes ``--break-system-packages --user``, as an agent in a stock Debian image
would, and leaves the image as Debian ships it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import io
import os
import shutil
import socket
import ssl
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.conftest import require
from tests.integration.egress_servers import TOOLS_DOCKERFILE, TOOLS_IMAGE, ensure_image

pytestmark = pytest.mark.docker

PIP_IMAGE = "adk-sandbox-test/egress-tools-pip:latest"
PIP_DOCKERFILE = f"""FROM {TOOLS_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/*
""".encode()

NAMES = ("pypi.test", "git.test", "files.pkg.test", "pkg.test", "api.test", "plain.test")
CA_IN_SANDBOX = "/tmp/egress-test-ca.pem"  # a path inside the sandbox
PACKAGE, VERSION = "egress_demo", "0.1"
MESSAGE = "installed through the policy"
FILE_BODY = b"a file through the policy\n"
README = "cloned through the policy\n"


# -- the test PKI: one CA, one leaf for every name ----------------------------------------------------------
def make_pki(names: tuple[str, ...]) -> tuple[bytes, bytes]:
    """(the CA certificate PEM, the server's certificate and key PEM) for ``names``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress tools test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(serialization.Encoding.PEM), leaf.public_bytes(
        serialization.Encoding.PEM
    ) + key_pem


# -- a static file server that records what it was asked ----------------------------------------------------
class StaticServer:
    """Serves ``root`` over HTTP (or HTTPS with ``tls``) on 127.0.0.1, recording ``(Host, path)`` per request.

    ``connections`` counts accepted connections, so "this server saw nothing" includes a bare connect.
    """

    def __init__(self, root: Path, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        self.connections = 0
        owner = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def setup(self) -> None:
                self.request.settimeout(10)
                if tls is not None:  # the handshake in this connection's thread, not in accept
                    self.request = tls.wrap_socket(self.request, server_side=True)
                super().setup()

            def send_head(self) -> Any:
                owner.requests.append((str(self.headers.get("Host", "")), self.path))
                return super().send_head()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                got = super().get_request()
                owner.connections += 1
                return got

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a refused handshake or a reset: the recorded requests tell the tests what happened

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def hosts(self) -> set[str]:
        """The names (``Host`` without the port) requests came for."""
        return {host.rsplit(":", 1)[0] for host, _ in self.requests}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- what the servers serve ---------------------------------------------------------------------------------
def make_wheel(where: Path) -> tuple[str, str]:
    """A pure-Python wheel of :data:`PACKAGE` written by hand in ``where``: (its file name, its sha256)."""
    dist_info = f"{PACKAGE}-{VERSION}.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": f"MESSAGE = {MESSAGE!r}\n".encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE.replace('_', '-')}\nVersion: {VERSION}\n".encode()
        ),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    filename = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    (where / filename).write_bytes(buffer.getvalue())
    return filename, hashlib.sha256(buffer.getvalue()).hexdigest()


def make_index(root: Path) -> None:
    """A PEP 503 simple index under ``root/simple`` with one project, its wheel under ``root/packages``."""
    (root / "packages").mkdir()
    filename, sha256 = make_wheel(root / "packages")
    project = root / "simple" / PACKAGE.replace("_", "-")
    project.mkdir(parents=True)
    (root / "simple" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{project.name}/">{project.name}</a></body></html>\n'
    )
    (project / "index.html").write_text(
        "<!DOCTYPE html><html><body>"
        f'<a href="../../packages/{filename}#sha256={sha256}">{filename}</a>'
        "</body></html>\n"
    )


def make_repository(root: Path, work: Path) -> None:
    """A bare repository ``root/repo.git`` with one commit (README), ready for git's dumb HTTP protocol."""
    require(shutil.which("git") is not None, "git is needed on the host to make the test repository")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]

    def git(*args: str, cwd: Path = work) -> None:
        subprocess.run(["git", *ident, *args], cwd=cwd, env=env, check=True, capture_output=True)

    work.mkdir()
    git("init", "-q")
    (work / "README").write_text(README)
    git("add", "README")
    git("commit", "-q", "-m", "the first commit")
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    git("update-server-info", cwd=root / "repo.git")


@dataclass
class Servers:
    ca: bytes  # the test CA's certificate (PEM)
    tls: StaticServer  # pypi.test, git.test, files.pkg.test, api.test: the index, the repository, a file
    other: StaticServer  # the same content on another port (api.test's port rule does not allow it)
    plain: StaticServer  # plain HTTP (plain.test)
    policy: NetworkPolicy


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    base = tmp_path_factory.mktemp("egress-tools")
    root = base / "root"
    root.mkdir()
    make_index(root)
    make_repository(root, base / "work")
    (root / "file.txt").write_bytes(FILE_BODY)
    ca, chain = make_pki(NAMES)
    (base / "server.pem").write_bytes(chain)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(base / "server.pem"))
    tls, other, plain = StaticServer(root, context), StaticServer(root, context), StaticServer(root)
    policy = NetworkPolicy(
        allow=[
            f"pypi.test:{tls.port}",
            f"git.test:{tls.port}",
            f"*.pkg.test:{tls.port}",
            f"api.test:{tls.port}",
            f"plain.test:{plain.port}",
        ],
        hosts={name: ["127.0.0.1"] for name in NAMES},
    )
    yield Servers(ca, tls, other, plain, policy)
    for server in (tls, other, plain):
        server.close()


@pytest.fixture(scope="module", params=["runc", "runsc"])
def session(
    request: pytest.FixtureRequest, docker_backend: DockerBackend, servers: Servers
) -> Iterator[DockerSession]:
    """One session per runtime, shared by the tests, with the test CA written into it."""
    runtime = None if request.param == "runc" else str(request.param)
    if runtime is not None:
        require(runtime in docker_backend._client.info().get("Runtimes", {}), f"{runtime} is not installed")
    ensure_image(docker_backend._client, TOOLS_IMAGE, TOOLS_DOCKERFILE)
    image = ensure_image(docker_backend._client, PIP_IMAGE, PIP_DOCKERFILE)
    backend = DockerBackend(image=image, network=servers.policy, runtime=runtime)
    try:
        with backend.session() as opened:
            opened.files.write_bytes(CA_IN_SANDBOX, servers.ca)
            yield opened
    finally:
        backend.close()


def run(session: DockerSession, code: str, timeout: float = 120) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


def test_pip_installs_from_a_local_index_over_https(session: DockerSession, servers: Servers) -> None:
    port = servers.tls.port
    result = run(
        session,
        f"python3 -m pip install --user --break-system-packages --no-cache-dir --disable-pip-version-check "
        f"--no-input --cert {CA_IN_SANDBOX} --index-url https://pypi.test:{port}/simple/ {PACKAGE}\n"
        f"cd / && python3 -c 'import {PACKAGE}; print({PACKAGE}.MESSAGE)'",
    )
    assert result.exit_code == 0, result
    assert result.stdout.strip().endswith(MESSAGE), result
    paths = [path for host, path in servers.tls.requests if host == f"pypi.test:{port}"]
    assert f"/simple/{PACKAGE.replace('_', '-')}/" in paths, servers.tls.requests
    assert any(path.startswith(f"/packages/{PACKAGE}-{VERSION}-") for path in paths), paths
    assert any(e.host == "pypi.test" and e.decision == "allowed" for e in session.network_log().entries)


def test_git_clones_over_https(session: DockerSession, servers: Servers) -> None:
    port = servers.tls.port
    result = run(
        session,
        'cd "$(mktemp -d)"\n'
        f"GIT_SSL_CAINFO={CA_IN_SANDBOX} git clone -q https://git.test:{port}/repo.git clone\n"
        "cat clone/README && git -C clone log --format=%s",
    )
    assert result.exit_code == 0, result
    assert result.stdout == README + "the first commit\n", result
    paths = [path for host, path in servers.tls.requests if host == f"git.test:{port}"]
    assert any(path.startswith("/repo.git/info/refs") for path in paths), servers.tls.requests
    assert any(e.host == "git.test" and e.decision == "allowed" for e in session.network_log().entries)


def test_a_wildcard_rule_and_a_port_rule(session: DockerSession, servers: Servers) -> None:
    port, other = servers.tls.port, servers.other.port
    curl = f"curl -sS -m 20 --cacert {CA_IN_SANDBOX} -o /dev/null -w '%{{http_code}}\\n'"
    result = run(
        session,
        f"{curl} https://files.pkg.test:{port}/file.txt\n"
        f"{curl} https://pkg.test:{port}/file.txt\n"
        f"{curl} https://api.test:{port}/file.txt\n"
        f"{curl} https://api.test:{other}/file.txt",
    )
    # A refused CONNECT is curl's error (000: the 403 is the proxy's answer to CONNECT, never a server's).
    assert result.stdout.splitlines() == ["200", "000", "200", "000"], result
    assert result.stderr.count("CONNECT tunnel failed, response 403") == 2, result
    # The 403's body, for plain requests, says which rule refused.
    wildcard = run(session, f'curl -sS -m 20 -x "$HTTP_PROXY" http://pkg.test:{port}/file.txt')
    assert f"refused pkg.test:{port}: no rule allows it (allowed: " in wildcard.stdout, wildcard
    ported = run(session, f'curl -sS -m 20 -x "$HTTP_PROXY" http://api.test:{other}/file.txt')
    assert f"no rule allows this port (the name is allowed by api.test:{port};" in ported.stdout, ported
    assert servers.tls.hosts() >= {"files.pkg.test", "api.test"}
    assert "pkg.test" not in servers.tls.hosts()
    assert servers.other.connections == 0 and servers.other.requests == []
    refused = {(e.host, e.port) for e in session.network_log().entries if e.decision == "refused"}
    assert {("pkg.test", port), ("api.test", other)} <= refused


def test_curl_and_urllib_to_an_allowed_https_and_http_name(session: DockerSession, servers: Servers) -> None:
    https = f"https://api.test:{servers.tls.port}/file.txt"
    http = f"http://plain.test:{servers.plain.port}/file.txt"
    result = run(
        session,
        f"curl -fsS -m 20 --cacert {CA_IN_SANDBOX} {https}\n"
        f"curl -fsS -m 20 {http}\n"
        f"SSL_CERT_FILE={CA_IN_SANDBOX} python3 - <<'PY'\n"
        "import urllib.request\n"
        f"for url in [{https!r}, {http!r}]:\n"
        "    with urllib.request.urlopen(url, timeout=20) as answer:\n"
        "        print(answer.status, answer.read().decode(), end='')\n"
        "PY",
    )
    assert result.exit_code == 0, result
    body = FILE_BODY.decode()
    assert result.stdout == body + body + f"200 {body}200 {body}", result
    assert (f"plain.test:{servers.plain.port}", "/file.txt") in servers.plain.requests
