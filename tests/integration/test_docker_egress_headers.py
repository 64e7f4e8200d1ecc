"""Credentials that never enter the sandbox: header injection through a Docker session, runc and gVisor.

The sandbox fetches ``https://api.test:<port>/`` with Python's ``urllib`` (its default trust: the bundle
the session wrote, named by ``SSL_CERT_FILE``). The server is a loopback TLS server on the host, reached by
a pin, with a certificate signed by a test CA that only the host side trusts (``upstream_ca``). It sees
the injected ``Authorization``; the sandbox's environment, files, ``/proc/*/environ``, ``/proc/*/cmdline``
and the response never hold the secret, nor the session CA's private key. A host without headers passes
through untouched: the sandbox's client verifies the server's own certificate and its own header arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.network.intercept import SANDBOX_CA_PATH
from adk_sandbox.executor.network.policy import NetworkPolicy
from tests.conftest import require
from tests.unit.test_network_intercept import BODY, TlsServer, make_test_pki, server_context

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

SECRET = "Bearer s3cr3t-for-api-test-only"  # noqa: S105 - a test credential


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> str | None:
    if request.param == "runsc":
        runtimes = docker_backend._client.info().get("Runtimes", {})
        require("runsc" in runtimes, "gVisor (runsc) is not installed in this engine")
        return "runsc"
    return None


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[str, TlsServer, TlsServer]]:
    """(the test CAs, the api.test server, the plain.test server)."""
    api_ca, api_cert, api_key = make_test_pki("api.test")
    plain_ca, plain_cert, plain_key = make_test_pki("plain.test")
    (tmp_path / "api").mkdir()
    (tmp_path / "plain").mkdir()
    api = TlsServer(server_context(api_cert, api_key, tmp_path / "api"))
    plain = TlsServer(server_context(plain_cert, plain_key, tmp_path / "plain"))
    yield api_ca + plain_ca, api, plain
    api.close()
    plain.close()


def python(session: DockerSession, code: str) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=60))


# Inside the sandbox: the API with the default trust (the session's bundle) and a forged credential, then
# the other host verified against its own CA (given in the code: the host side does not trust it for it).
FETCH = """
import os, ssl, urllib.request
request = urllib.request.Request(API, headers={"Authorization": "Bearer forged-by-the-sandbox"})
with urllib.request.urlopen(request, timeout=20) as answer:
    print("api", answer.status, answer.read().decode().strip(), dict(answer.headers))
context = ssl.create_default_context(cadata=PLAIN_CA)
request = urllib.request.Request(PLAIN, headers={"Authorization": "Bearer sandbox-own"})
with urllib.request.urlopen(request, context=context, timeout=20) as answer:  # trusts the test CA only
    print("plain", answer.status, answer.read().decode().strip())
print("env", {k: v for k, v in os.environ.items() if "CERT" in k or "CA" in k})
"""

# Inside the sandbox: every readable file (and each process's environ and cmdline) searched for needles
# given hex-reversed, so the needles themselves are in no file, argument or variable of the sandbox.
SEARCH = """
import os
needles = [bytes.fromhex(h[::-1]) for h in HEX]
found, scanned = [], 0
def check(path):
    global scanned
    try:
        with open(path, "rb") as f:
            data = f.read(4 << 20)
    except OSError:
        return
    scanned += 1
    for i, needle in enumerate(needles):
        if needle in data:
            found.append((i, path))
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        path = os.path.join(top, name)
        if os.path.isfile(path) and not os.path.islink(path):
            check(path)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        check("/proc/%s/environ" % pid)
        check("/proc/%s/cmdline" % pid)
print("scanned", scanned, "found", found)
"""


def test_headers_are_injected_on_the_host_and_the_secret_never_enters_the_sandbox(
    runtime: str | None, servers: tuple[str, TlsServer, TlsServer]
) -> None:
    test_ca, api, plain = servers
    policy = NetworkPolicy(
        allow=[f"api.test:{api.port}", f"plain.test:{plain.port}"],
        hosts={"api.test": ["127.0.0.1"], "plain.test": ["127.0.0.1"]},
        headers={"api.test": {"Authorization": SECRET}},
        upstream_ca=(test_ca,),
    )
    backend = DockerBackend(network=policy, runtime=runtime)
    try:
        with backend.session() as session:
            code = (
                f"API = 'https://api.test:{api.port}/v1/models'\nPLAIN = 'https://plain.test:{plain.port}/x'\n"
                f"PLAIN_CA = {test_ca!r}\n{FETCH}"
            )
            result = python(session, code)
            assert result.exit_code == 0, result
            lines = result.stdout.splitlines()
            assert lines[0].startswith(f"api 200 {BODY.decode().strip()}"), result
            assert lines[1] == f"plain 200 {BODY.decode().strip()}", result
            assert f"'SSL_CERT_FILE': '{SANDBOX_CA_PATH}'" in lines[2]
            for name in ("REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO"):
                assert f"'{name}': '{SANDBOX_CA_PATH}'" in lines[2]
            assert SECRET not in result.stdout + result.stderr

            # The server saw the injected credential, once, and not the sandbox's forged one.
            (got,) = api.received
            assert got.startswith(b"GET /v1/models HTTP/1.1\r\n")
            authorizations = [h for h in got.split(b"\r\n") if h.lower().startswith(b"authorization:")]
            assert authorizations == [f"Authorization: {SECRET}".encode()]
            assert b"forged" not in got
            # The host without headers: the sandbox's own header, untouched, and no secret.
            (other,) = plain.received
            assert b"Authorization: Bearer sandbox-own\r\n" in other and SECRET.encode() not in other

            # Nowhere in the sandbox: the secret, nor the session CA's private key (PEM or raw scalar).
            interceptor = session._interceptor
            assert interceptor is not None
            key = interceptor.ca._key
            key_pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            key_body = b"".join(key_pem.splitlines()[1:-1])[:48]
            scalar = key.private_numbers().private_value.to_bytes(32, "big")
            # A control needle that is there (the CA certificate in the bundle): the search does find.
            control = b"".join(interceptor.ca.certificate_pem.splitlines()[1:2])
            needles = [SECRET.encode(), key_body, scalar, control]
            hexes = [needle.hex()[::-1] for needle in needles]
            search = python(session, f"HEX = {hexes!r}\n{SEARCH}")
            assert search.exit_code == 0, search
            scanned = int(search.stdout.split()[1])
            assert scanned > 1000 and search.stdout.strip().endswith(f"found [(3, '{SANDBOX_CA_PATH}')]"), (
                search
            )
            bundle = session.files.read_bytes(SANDBOX_CA_PATH, limit=8 << 20)
            assert interceptor.ca.certificate_pem in bundle and b"PRIVATE KEY" not in bundle

            log = session.network_log().entries
            injected = [e for e in log if e.host == "api.test"]
            assert injected and injected[0].decision == "allowed" and "headers injected" in injected[0].detail
            assert all(SECRET not in repr(entry) for entry in log)
    finally:
        backend.close()
