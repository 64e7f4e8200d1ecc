"""ProcessBackend under the real bubblewrap with a NetworkPolicy: the proxy inside, the relay on the host.

The servers run on this host (``egress_servers.py``) and the policy pins its names to ``127.0.0.1`` (a
pinned address is not refused), so every request goes sandbox -> forwarder -> Unix socket -> relay ->
server, and each server records what it was sent: "nothing was delivered" is checked on the receiving end.

The attack tests (``test_attack_*``) each fail on a naive design, bubblewrap without ``--unshare-net``
plus a proxy variable: there the sandbox shares the host's network, so ``curl --noproxy '*'``, a direct
socket to ``127.0.0.1:<server port>`` or to the host's own address reach the server. Under the design
tested here the sandbox has only its own ``lo``: no route, the servers get nothing. (Checked by hand once
by dropping ``--unshare-net`` from ``bwrap_arguments``: the four attack tests then fail.) The flood test
holds a thousand connections open at once, to the forwarder and to the host's socket directly, and
checks that the host serves at most 256 at a time and that the next command still works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adk_sandbox.executor import (
    BubblewrapEnforcer,
    ExecRequest,
    ExecResult,
    PolicyNotEnforceableError,
    ProcessBackend,
    SandboxPolicy,
)
from adk_sandbox.executor.network import NetworkPolicy
from adk_sandbox.executor.network.passed_socket import PASSED_RULE
from adk_sandbox.executor.network.unix_endpoint import MAX_CONNECTIONS, OVER_LIMIT_RULE
from adk_sandbox.testing import ConformanceSuite, ConformanceTarget, KnownDifference
from tests.conformance.table import column
from tests.conftest import require
from tests.integration.egress_servers import BODY, Upstream, make_certificate, server_context

pytestmark = pytest.mark.bwrap

#: Where the command's socket is, seen from inside (its directory is bound at the host's path).
SOCKETS = os.path.join(tempfile.gettempdir(), "adk-egress-*", "egress.sock")
SECRET = "Bearer s3cret-token-never-inside"  # noqa: S105 - a test credential


@dataclass
class Stand:
    """The servers, the CA file the sandbox may read, and a backend whose policy allows them."""

    plain: Upstream
    tls: Upstream
    ca_dir: Path
    backend: ProcessBackend

    @property
    def cafile(self) -> str:
        return str(self.ca_dir / "cert.pem")


def _sandbox_policy(ca_dir: Path) -> SandboxPolicy:
    return SandboxPolicy.builder().allow_read(ca_dir).allow_process_spawn().build()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("cert"))


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory: pytest.TempPathFactory, certificate: tuple[Path, Path]) -> Path:
    where = tmp_path_factory.mktemp("ca")
    shutil.copy(certificate[0], where / "cert.pem")  # the certificate only; its key stays outside
    return where


@pytest.fixture(scope="module")
def stand(
    bwrap_enforcer: BubblewrapEnforcer, certificate: tuple[Path, Path], ca_dir: Path
) -> Iterator[Stand]:
    plain, tls = Upstream(), Upstream(tls=server_context(certificate))
    policy = NetworkPolicy(
        allow=[f"allowed.test:{plain.port}", f"allowed.test:{tls.port}"],
        deny=["denied.test"],
        hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
    )
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, _sandbox_policy(ca_dir), network=policy)
    yield Stand(plain, tls, ca_dir, backend)
    plain.close()
    tls.close()


def sh(backend: ProcessBackend, code: str, timeout: float = 60, **kw: object) -> ExecResult:
    request = ExecRequest.model_validate({"language": "command", "code": code, "timeout": timeout, **kw})
    return backend.execute(request)


def py(backend: ProcessBackend, code: str, timeout: float = 60) -> ExecResult:
    return backend.execute(ExecRequest(language="python", code=code, timeout=timeout))


def host_address() -> str:
    """This host's own (non-loopback) IPv4 address."""
    ip = shutil.which("ip")
    require(ip is not None, "the ip command is needed to find this host's address")
    assert ip is not None
    out = subprocess.run(
        [ip, "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True
    )
    addresses = [line.split()[3].split("/")[0] for line in out.stdout.splitlines() if len(line.split()) > 3]
    require(bool(addresses), "this host has no global IPv4 address")
    return addresses[0]


def require_curl() -> str:
    curl = shutil.which("curl")
    require(curl is not None and curl.startswith(("/usr/", "/bin/")), "curl is needed (under /usr or /bin)")
    assert curl is not None
    return curl


# -- allowed -------------------------------------------------------------------------------------------------
def test_capabilities_report_the_policy(stand: Stand) -> None:
    capabilities = stand.backend.capabilities()
    assert capabilities.network is True
    assert capabilities.network_policy == stand.backend.egress


def test_allowed_name_over_plain_http_with_urllib(stand: Stand) -> None:
    before = len(stand.plain.received)
    result = py(
        stand.backend,
        f"import urllib.request; print(urllib.request.urlopen('http://allowed.test:{stand.plain.port}/x').read())",
    )
    assert result.exit_code == 0, result.stderr
    assert repr(BODY) in result.stdout
    assert stand.plain.received[before].startswith(b"GET /x HTTP/1.1")


def test_allowed_name_over_https_with_urllib(stand: Stand) -> None:
    before = len(stand.tls.received)
    code = (
        "import ssl, urllib.request\n"
        f"context = ssl.create_default_context(cafile={stand.cafile!r})\n"
        f"print(urllib.request.urlopen('https://allowed.test:{stand.tls.port}/s', context=context).read())\n"
    )
    result = py(stand.backend, code)
    assert result.exit_code == 0, result.stderr
    assert repr(BODY) in result.stdout
    assert stand.tls.received[before].startswith(b"GET /s HTTP/1.1")


def test_allowed_name_with_curl_http_and_https(stand: Stand) -> None:
    require_curl()
    plain, tls = len(stand.plain.received), len(stand.tls.received)
    result = sh(
        stand.backend,
        f"curl -sS --fail http://allowed.test:{stand.plain.port}/c && "
        f"curl -sS --fail --cacert {stand.cafile} https://allowed.test:{stand.tls.port}/c",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (BODY * 2).decode()
    assert stand.plain.received[plain].startswith(b"GET /c HTTP/1.1")
    assert stand.tls.received[tls].startswith(b"GET /c HTTP/1.1")


def test_streams_and_exit_status_pass_through(stand: Stand) -> None:
    result = sh(stand.backend, "cat; echo err >&2; exit 5", stdin="fed\n")
    assert (result.stdout, result.stderr, result.exit_code) == ("fed\n", "err\n", 5)
    assert sh(stand.backend, "kill -9 $$").exit_code == 128 + 9


# -- refused -------------------------------------------------------------------------------------------------
def test_denied_name_gets_the_403_naming_the_rule(stand: Stand) -> None:
    require_curl()
    delivered = stand.plain.delivered
    result = sh(stand.backend, f"curl -sS -i http://denied.test:{stand.plain.port}/")
    assert result.stdout.startswith("HTTP/1.1 403"), result
    assert "deny denied.test" in result.stdout
    tls_delivered = stand.tls.delivered
    result = sh(stand.backend, f"curl -sS --cacert {stand.cafile} https://denied.test:{stand.tls.port}/")
    assert result.exit_code != 0
    assert stand.plain.delivered == delivered
    assert stand.tls.delivered == tls_delivered


def test_attack_curl_without_the_proxy(stand: Stand) -> None:
    require_curl()
    delivered = stand.plain.delivered
    result = sh(
        stand.backend,
        f"curl -sS --noproxy '*' --connect-timeout 5 --resolve allowed.test:{stand.plain.port}:127.0.0.1 "
        f"http://allowed.test:{stand.plain.port}/",
    )
    assert result.exit_code != 0
    assert BODY.decode() not in result.stdout
    assert stand.plain.delivered == delivered


def _direct(address: str, port: int) -> str:
    return (
        "import socket, sys\n"
        "try:\n"
        f"    s = socket.create_connection(({address!r}, {port}), timeout=5)\n"
        "    s.sendall(b'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n')\n"
        "    print('connected', s.recv(100))\n"
        "except OSError as error:\n"
        "    print('refused', error)\n"
        "    sys.exit(3)\n"
    )


def test_attack_direct_socket_to_loopback_server(stand: Stand) -> None:
    delivered = stand.plain.delivered
    result = py(stand.backend, _direct("127.0.0.1", stand.plain.port))
    assert result.exit_code == 3, result
    assert stand.plain.delivered == delivered


def test_attack_direct_socket_to_the_hosts_own_address(stand: Stand) -> None:
    address = host_address()
    server = Upstream(host=address)
    try:
        result = py(stand.backend, _direct(address, server.port))
        assert result.exit_code == 3, result
        assert "Network is unreachable" in result.stdout, result.stdout
        assert server.delivered == 0
        assert server.raw == []
    finally:
        server.close()


def test_attack_curl_to_the_hosts_own_address(stand: Stand) -> None:
    require_curl()
    address = host_address()
    server = Upstream(host=address)
    try:
        result = sh(
            stand.backend, f"curl -sS --noproxy '*' --connect-timeout 5 http://{address}:{server.port}/"
        )
        assert result.exit_code != 0
        assert server.raw == []
    finally:
        server.close()


#: Connects to the command's socket itself and passes ``make()``'s descriptor (the forwarder's protocol: one
#: byte carrying it); prints what the client end ``make()`` returns (if any) reads back.
_HAND_OVER = """
import array, glob, os, socket
[path] = glob.glob(SOCKETS)
fd, client = make()
unix = socket.socket(socket.AF_UNIX)
unix.connect(path)
unix.sendmsg([b"\\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
unix.settimeout(20)
try:
    while unix.recv(100):
        pass
except ConnectionResetError:
    pass
if client is not None:
    client.settimeout(20)
    print(client.recv(200).decode())
"""


def test_direct_connection_to_the_hosts_socket_is_judged_by_the_relay(stand: Stand) -> None:
    # The command can skip the forwarder and pass a socket of its own: the relay decides the same.
    delivered = stand.plain.delivered
    code = (
        "import socket\n"
        "def make():\n"
        "    listener = socket.create_server(('127.0.0.1', 0))\n"
        "    client = socket.create_connection(listener.getsockname())\n"
        f"    client.sendall(b'GET http://denied.test:{stand.plain.port}/ HTTP/1.1\\r\\n'\n"
        f"                   b'Host: denied.test:{stand.plain.port}\\r\\n\\r\\n')\n"
        "    return listener.accept()[0].detach(), client\n"
    )
    result = py(stand.backend, f"SOCKETS = {SOCKETS!r}\n{code}{_HAND_OVER}")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("HTTP/1.1 403")
    assert stand.plain.delivered == delivered


def test_attack_passing_a_pipe_with_an_allowed_request(stand: Stand) -> None:
    """The command passes the read end of a pipe holding a valid request for an allowed host.

    Catches a host that serves any descriptor it is passed (reading the request from the pipe and relaying
    it): the allowed server must get nothing, and the log says the passed descriptor was refused.
    """
    delivered, logged = stand.plain.delivered, len(stand.backend.network_log().entries)
    code = (
        "import os\n"
        "def make():\n"
        "    r, w = os.pipe()\n"
        f"    os.write(w, b'GET http://allowed.test:{stand.plain.port}/pipe HTTP/1.1\\r\\n'\n"
        f"                b'Host: allowed.test:{stand.plain.port}\\r\\n\\r\\n')\n"
        "    return r, None\n"
    )
    result = py(stand.backend, f"SOCKETS = {SOCKETS!r}\n{code}{_HAND_OVER}")
    assert result.exit_code == 0, result.stderr
    time.sleep(0.3)  # the server's threads record what they got
    assert stand.plain.delivered == delivered
    entries = stand.backend.network_log().entries[logged:]
    assert [(entry.decision, entry.rule) for entry in entries] == [("refused", PASSED_RULE)], entries
    assert "pipe" in entries[0].detail


def test_killing_the_forwarder_ends_the_command(stand: Stand) -> None:
    # Its parent is the forwarder, bwrap's first process: the sandbox ends with it (no network left behind).
    result = sh(stand.backend, "kill -9 $PPID; sleep 5; echo still running")
    assert result.exit_code == 128 + 9
    assert "still running" not in result.stdout
    assert result.duration_ms < 4000
    test_allowed_name_with_curl_http_and_https(stand)


# -- header injection ---------------------------------------------------------------------------------------
def test_header_injection_keeps_the_secret_on_the_host(
    bwrap_enforcer: BubblewrapEnforcer, certificate: tuple[Path, Path], ca_dir: Path
) -> None:
    require_curl()
    server = Upstream(tls=server_context(certificate))
    policy = NetworkPolicy(
        allow=[f"allowed.test:{server.port}"],
        hosts={"allowed.test": ["127.0.0.1"]},
        headers={"allowed.test": {"Authorization": SECRET}},
        upstream_ca=[certificate[0].read_text()],
    )
    backend = ProcessBackend.with_sandbox(bwrap_enforcer, _sandbox_policy(ca_dir), network=policy)
    try:
        # No --cacert: the trust variables name the bundle holding the per-command CA.
        result = sh(backend, f"curl -sS --fail https://allowed.test:{server.port}/h")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == BODY.decode()
        assert f"authorization: {SECRET}".lower().encode() in server.received[-1].lower()
        # What the sandbox can see: its environment, its processes', and every file bound in for the proxy.
        looked = sh(
            backend,
            'env; cat /proc/*/environ 2>/dev/null | tr "\\0" "\\n"; echo "bundle=$SSL_CERT_FILE"; '
            'ls -la "$(dirname "$SSL_CERT_FILE")"; '
            'for f in "$(dirname "$SSL_CERT_FILE")"/*; do if [ -f "$f" ]; then cat "$f"; fi; done',
        )
        assert looked.exit_code == 0, looked.stderr
        assert f"bundle={tempfile.gettempdir()}/adk-egress-" in looked.stdout
        assert "BEGIN CERTIFICATE" in looked.stdout
        assert "PRIVATE KEY" not in looked.stdout
        assert "s3cret" not in looked.stdout
        assert "s3cret" not in looked.stderr
        entries = backend.network_log().entries
        assert any("headers injected (Authorization)" in entry.detail for entry in entries)
        assert all("s3cret" not in entry.detail for entry in entries)
    finally:
        server.close()


# -- bounded, and logged -------------------------------------------------------------------------------------
_FLOOD = """
import glob, os, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
[path] = glob.glob(SOCKETS)
held = []
for _ in range(1000):
    held.append(socket.create_connection(('127.0.0.1', port)))
for _ in range(1000):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
print('opened', len(held), flush=True)
time.sleep(3)
"""


def test_thousand_connections_stay_bounded_and_the_next_command_works(stand: Stand) -> None:
    baseline = threading.active_count()
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, threading.active_count())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = py(stand.backend, f"SOCKETS = {SOCKETS!r}\n{_FLOOD}", timeout=120)
    finally:
        done.set()
        sampler.join()
    assert result.exit_code == 0, result.stderr
    assert "opened 2000" in result.stdout
    # One relay thread per served connection, plus the listener and the sampler: never 2000.
    assert peak - baseline <= MAX_CONNECTIONS + 8, (peak, baseline)
    over = [entry for entry in stand.backend.network_log().entries if entry.rule == OVER_LIMIT_RULE]
    assert over, "the connections over the bound were not counted"
    # The forwarder carries 256 of its thousand (the rest closed inside), which fill the host's bound: the
    # thousand direct ones are all turned away.
    assert int(over[-1].detail.split()[0]) >= 1000
    deadline = time.monotonic() + 10
    while threading.active_count() > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= baseline + 2  # every relay ended with the command
    test_allowed_name_with_curl_http_and_https(stand)


def test_the_log_records_allowed_and_refused(stand: Stand) -> None:
    require_curl()
    sh(stand.backend, f"curl -sS http://allowed.test:{stand.plain.port}/log; curl -sS http://elsewhere.test/")
    expected = [("allowed.test", "allowed"), ("elsewhere.test", "refused")]
    # A relay records its entry once both its threads have ended, which can be after curl has its answer
    # and the next one is refused: the two entries may come in either order, and the first a little late.
    deadline = time.monotonic() + 10
    while True:
        entries = sorted(stand.backend.network_log().entries[-2:], key=lambda entry: entry.host)
        if [(e.host, e.decision) for e in entries] == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(e.host, e.decision) for e in entries] == expected
    assert entries[0].rule == f"allow allowed.test:{stand.plain.port}"
    assert entries[0].bytes_down > len(BODY)
    assert entries[1].rule == "no rule allows it"


# -- what every backend owes, with the forwarder in front of every command --------------------------------
class TestBubblewrapEgressConformance(ConformanceSuite):
    """The conformance suite on bubblewrap under a policy: timeouts, escapees, output caps, stdin, ..."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(
        cls, bwrap_enforcer: BubblewrapEnforcer, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ConformanceTarget]:
        workdir: Path = tmp_path_factory.mktemp("bwrap-egress-workdir")
        policy = SandboxPolicy.builder().allow_process_spawn().allow_read_write(workdir).build()
        network = NetworkPolicy(allow=["allowed.test"])
        with ProcessBackend.with_sandbox(bwrap_enforcer, policy, workdir=workdir, network=network) as backend:
            yield ConformanceTarget(
                backend,
                processes="host",
                scratch=str(workdir),
                table=column("bwrap + NetworkPolicy"),
                known_differences={
                    "user_other": KnownDifference(
                        "host backends run commands as the calling user; another uid:gid is refused",
                        raises=PolicyNotEnforceableError,
                    )
                },
            )
