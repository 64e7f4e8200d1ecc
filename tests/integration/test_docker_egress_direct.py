"""The direct path of a Docker session's proxy (docs/network.md, "Speed"): a Unix socket, token first.

On a local engine's runc sandbox the agent carries each proxied connection to a per-session Unix socket the
host listens on, bound read-only into the container, opened by the session's token; on gVisor (no
``--host-uds``) the probe fails and connections travel as frames. The servers are loopback servers these
tests start, reached only through ``hosts`` pins; "nothing was relayed" is checked on them. The attacks run
inside the sandbox (or as other host processes) and are judged from the host.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import stat
import time
from collections.abc import Iterator

import pytest

from adk_sandbox.executor import ExecRequest, ExecResult, Language
from adk_sandbox.executor._layout import DIRECT_MOUNT
from adk_sandbox.executor.backends.docker import DockerBackend, DockerSession
from adk_sandbox.executor.network.passed_socket import PASSED_RULE
from adk_sandbox.executor.network.policy import NetworkPolicy
from adk_sandbox.executor.network.relay import DEFAULT_HEAD_TIMEOUT
from adk_sandbox.executor.network.unix_endpoint import SOCKET_NAME, TOKEN_RULE
from tests.conftest import require
from tests.integration.egress_servers import Upstream
from tests.integration.test_docker_set_network import SlowServer, start_download, wait_for
from tests.loopback_server import LoopbackServer

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

SIZE = 16 * 1024 * 1024
INSIDE = f"{DIRECT_MOUNT}/{SOCKET_NAME}"


class BulkServer(LoopbackServer):
    """A loopback HTTP server answering every request with :data:`SIZE` fixed pseudo-random bytes."""

    body = hashlib.shake_256(b"direct path").digest(SIZE)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            got = b""
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % SIZE
            conn.sendall(head + self.body)


DOWNLOAD = """
import hashlib, urllib.request
with urllib.request.urlopen(URL, timeout=60) as answer:
    digest, size = hashlib.sha256(), 0
    while chunk := answer.read(1 << 20):
        digest.update(chunk); size += len(chunk)
print(size, digest.hexdigest())
"""

#: Connects straight to the session's socket inside and sends ``FIRST`` then a request head for ``URL``.
RAW = f"""
import socket
sock = socket.socket(socket.AF_UNIX)
sock.connect({INSIDE!r})
sock.settimeout(15)
sock.sendall(FIRST + b"GET " + URL.encode() + b" HTTP/1.1\\r\\nHost: " + HOST.encode() + b"\\r\\n\\r\\n")
got = b""
try:
    while chunk := sock.recv(65536):
        got += chunk
except OSError as error:
    print("ERROR", type(error).__name__)
print(repr(got[:200]))
"""


def policy_for(*ports: int) -> NetworkPolicy:
    return NetworkPolicy(
        allow=[f"allowed.test:{port}" for port in ports],
        hosts={"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]},
    )


def python(session: DockerSession, code: str, user: str | None = None) -> ExecResult:
    return session.execute(ExecRequest(language=Language.PYTHON, code=code, timeout=90, user=user))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[BulkServer, Upstream, Upstream]]:
    bulk, allowed, denied = BulkServer(), Upstream(), Upstream()
    yield bulk, allowed, denied
    for server in (bulk, allowed, denied):
        server.close()


@pytest.fixture(scope="module")
def runc_session(servers: tuple[BulkServer, Upstream, Upstream]) -> Iterator[DockerSession]:
    bulk, allowed, _ = servers
    backend = DockerBackend(network=policy_for(bulk.port, allowed.port))
    try:
        with backend.session() as session:
            session.start()
            yield session
    finally:
        backend.close()


def test_runc_downloads_through_the_direct_path(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    bulk = servers[0]
    result = python(runc_session, f"URL = 'http://allowed.test:{bulk.port}/bulk'\n{DOWNLOAD}")
    assert result.stdout.split() == [str(SIZE), hashlib.sha256(bulk.body).hexdigest()], result
    assert runc_session.egress_mode == "unix"
    entry = runc_session.network_log().entries[-1]
    assert (entry.decision, entry.port) == ("allowed", bulk.port) and entry.bytes_down > SIZE


def test_gvisor_falls_back_to_frames_and_works(
    docker_backend: DockerBackend, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    require("runsc" in docker_backend._client.info().get("Runtimes", {}), "gVisor (runsc) is not installed")
    bulk = servers[0]
    backend = DockerBackend(network=policy_for(bulk.port), runtime="runsc")
    try:
        with backend.session() as session:
            result = python(session, f"URL = 'http://allowed.test:{bulk.port}/bulk'\n{DOWNLOAD}")
            assert result.stdout.split() == [str(SIZE), hashlib.sha256(bulk.body).hexdigest()], result
            assert session.egress_mode == "frames"
    finally:
        backend.close()


def test_set_network_false_cuts_a_live_direct_download_and_close_removes_the_socket() -> None:
    slow = SlowServer()
    backend = DockerBackend(network=policy_for(slow.port))
    try:
        with backend.session() as session:
            thread, results = start_download(session, slow)
            assert session.egress_mode == "unix"
            directory = session._egress.direct_directory
            assert directory is not None and os.path.exists(os.path.join(directory, SOCKET_NAME))
            session.set_network(False)
            thread.join(timeout=30)
            assert not thread.is_alive() and results[0].stdout.startswith("DROPPED"), results
            wait_for(slow.cut.is_set)  # the server saw the connection go
            assert session.open_connections() == []
        assert not os.path.exists(os.path.dirname(directory)), "the socket's directory outlived the session"
    finally:
        backend.close()
        slow.close()


def test_inside_without_the_token_nothing_is_relayed(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    """A process inside connects to the socket itself, with no token and with a forged one.

    Catches a socket that relays whatever connects to it (a design trusting the mount to be the agent's
    alone): the request names an allowed host, so without the token check it would reach the server.
    """
    allowed = servers[1]
    before = len(allowed.received)
    url = f"http://allowed.test:{allowed.port}/stolen"
    for first in (b"", b"0" * 64, b"deadbeef" * 8):
        code = f"FIRST = {first!r}\nURL = {url!r}\nHOST = 'allowed.test:{allowed.port}'\n{RAW}"
        result = python(runc_session, code)
        assert result.stdout.strip().endswith("b''"), result  # closed, nothing answered
    assert len(allowed.received) == before
    refused = [entry for entry in runc_session.network_log().entries if entry.rule == TOKEN_RULE]
    assert len(refused) >= 3 and all(entry.decision == "refused" for entry in refused)


#: Inside, holding the real ``TOKEN`` (a compromised agent): a loopback TCP connection (``client``,
#: ``accepted``) whose accepted end is passed to the session's socket, as the agent passes its client's.
PASSED_PAIR = f"""
import socket
def pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        return client, listener.accept()[0]
client, accepted = pair()
with socket.socket(socket.AF_UNIX) as unix:
    unix.connect({INSIDE!r})
    unix.sendall(TOKEN)
    socket.send_fds(unix, [b"\\0"], [accepted.fileno()])
"""
#: ``PASSED_PAIR``, then the client sends a request for ``URL`` and prints what it reads back.
PASS = (
    PASSED_PAIR
    + """accepted.close()
client.settimeout(15)
client.sendall(b"GET " + URL.encode() + b" HTTP/1.1\\r\\nHost: " + HOST.encode() + b"\\r\\n\\r\\n")
got = b""
while chunk := client.recv(65536):
    got += chunk
print(repr(got[:200]))
"""
)


def test_inside_with_the_real_token_the_policy_still_decides(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    """A process inside holding the session's token (leaked to it here) reaches only what the policy allows.

    Catches a direct path that skips the policy (a socket spliced straight to the server, or one that trusts
    whatever the agent hands it): the denied host must still get nothing and the client a 403.
    """
    _, allowed, denied = servers
    token = token_of(runc_session)
    url = f"http://denied.test:{denied.port}/"
    code = f"TOKEN = {token!r}\nURL = {url!r}\nHOST = 'denied.test:{denied.port}'\n{PASS}"
    result = python(runc_session, code)
    assert "403 Forbidden" in result.stdout and "no rule allows it" in result.stdout, result
    assert denied.received == []
    url = f"http://allowed.test:{allowed.port}/with-token"
    code = f"TOKEN = {token!r}\nURL = {url!r}\nHOST = 'allowed.test:{allowed.port}'\n{PASS}"
    result = python(runc_session, code)
    assert "200 OK" in result.stdout, result
    assert any(head.startswith(b"GET /with-token ") for head in allowed.received)


def token_of(session: DockerSession) -> bytes:
    direct = session._egress._direct
    assert direct is not None
    return direct.token.encode()


def direct_live(session: DockerSession) -> int:
    """How many connections the session's socket serves now (token, passed socket or relay)."""
    direct = session._egress._direct
    assert direct is not None
    return direct.live


def test_host_processes_without_the_token_get_nothing(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    """Another process of this machine: another user cannot even reach the socket; this user's get nothing.

    Catches a socket in a directory other users can pass, and one without a token (any local process of the
    same user could then use the session's policy, pins to loopback included).
    """
    allowed = servers[1]
    directory = runc_session._egress.direct_directory
    assert directory is not None
    path = os.path.join(directory, SOCKET_NAME)
    assert stat.S_IMODE(os.stat(os.path.dirname(directory)).st_mode) == 0o700
    before = len(allowed.received)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.settimeout(15)
        sock.sendall(b"GET http://allowed.test:%d/host HTTP/1.1\r\nHost: allowed.test\r\n\r\n" % allowed.port)
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        assert answer == b""
    assert len(allowed.received) == before
    if os.geteuid() == 0:  # another user of this machine: the 0700 directory stops it before the socket
        assert other_user_connects(path) == errno.EACCES


def other_user_connects(path: str) -> int:
    """The errno of connecting to ``path`` as uid and gid 65534 (0: connected), in a forked child."""
    pid = os.fork()
    if pid == 0:  # only system calls until _exit: safe in a forked copy of a threaded process
        code = 255
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            socket.socket(socket.AF_UNIX).connect(path)
            code = 0
        except OSError as error:
            code = error.errno or 255
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_socket_directory_is_read_only_inside(runc_session: DockerSession) -> None:
    """Root inside (user 0, owner of the directory's inode) cannot replace the socket or plant files.

    Catches a writable bind (or one whose safety rests on modes alone): root inside owns the host directory
    by uid, so only the read-only mount stops an unlink, a rename or a socket of its own at the path.
    """
    directory = runc_session._egress.direct_directory
    assert directory is not None
    path = os.path.join(directory, SOCKET_NAME)
    inode = os.stat(path).st_ino
    code = f"""
import os, socket
for name, attempt in [
    ("unlink", lambda: os.unlink({INSIDE!r})),
    ("rename", lambda: os.rename({INSIDE!r}, {DIRECT_MOUNT!r} + "/moved")),
    ("create", lambda: open({DIRECT_MOUNT!r} + "/planted", "w")),
    ("mkdir", lambda: os.mkdir({DIRECT_MOUNT!r} + "/d")),
    ("bind", lambda: socket.socket(socket.AF_UNIX).bind({DIRECT_MOUNT!r} + "/other.sock")),
    ("chmod", lambda: os.chmod({DIRECT_MOUNT!r}, 0o777)),
]:
    try:
        attempt(); print("DONE", name)
    except OSError as error:
        print("refused", name, error.errno)
"""
    for user in ("0", None):
        result = python(runc_session, code, user=user)
        assert "DONE" not in result.stdout and result.stdout.count("refused") == 6, result
    assert os.listdir(directory) == [SOCKET_NAME]
    assert os.stat(path).st_ino == inode


def test_parallel_direct_connections_stay_bounded(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    """Many connections at once on the direct path: each gets its answer, and the session keeps working."""
    allowed = servers[1]
    code = f"""
import threading, urllib.request
ok = []
def one():
    with urllib.request.urlopen('http://allowed.test:{allowed.port}/many', timeout=60) as answer:
        ok.append(answer.status)
threads = [threading.Thread(target=one) for _ in range(64)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(ok), set(ok))
"""
    result = python(runc_session, code)
    assert result.stdout.strip() == "64 {200}", result


# -- a compromised agent passing what is not its client's socket ---------------------------------------------
#: Runs every attack in turn, each on a fresh connection to the session's socket opened by the real ``TOKEN``,
#: and waits until the host closed that connection before the next (so the log's entries come in order).
#: ``HEAD`` is a valid request for the allowed server: whatever the host relayed from it would reach it.
ATTACKER = f"""
import array, json, os, socket, tempfile
def pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        return client, listener.accept()[0]
def send(fds, data=b"\\\\0"):
    unix = socket.socket(socket.AF_UNIX)
    unix.connect({INSIDE!r})
    unix.sendall(TOKEN)
    control = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    unix.sendmsg([data], control)
    unix.settimeout(20)
    try:
        while unix.recv(100):
            pass
    except ConnectionResetError:
        pass
    unix.close()
def pipe():
    r, w = os.pipe()
    os.write(w, HEAD)
    send([r])
def socketpair():
    a, b = socket.socketpair()
    b.sendall(HEAD)
    send([a.fileno()])
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.connect(("127.0.0.1", 9))
    send([u.fileno()])
def listening():
    s = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(s.getsockname())
    c.sendall(HEAD)
    send([s.fileno()])
def unconnected():
    s = socket.socket()  # held: a temporary's descriptor would be closed (and reused) before the send
    send([s.fileno()])
def netlink():
    n = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    send([n.fileno()])
def regular_file():
    f = tempfile.TemporaryFile()
    f.write(HEAD); f.flush(); f.seek(0)
    send([f.fileno()])
def two_sockets():
    (c1, a1), (c2, a2) = pair(), pair()
    c1.sendall(HEAD); c2.sendall(HEAD)
    send([a1.fileno(), a2.fileno()])
def no_descriptor():
    send([], b"\\\\0" + HEAD)  # the old protocol: the request on the Unix connection itself
for attack in ATTACKS:
    globals()[attack]()
print(json.dumps("done"))
"""

#: Each attack, and what the host's refusal says (its log entry's detail).
ATTACKS = {
    "pipe": "a pipe",
    "socketpair": "not an internet socket",
    "udp": "not a stream socket",
    "listening": "a listening socket",
    "unconnected": "not connected",
    "netlink": "not an internet socket",
    "regular_file": "a file",
    "two_sockets": "got 2",
    "no_descriptor": "got 0",
}


def head_for(allowed: Upstream) -> bytes:
    return b"GET http://allowed.test:%d/passed HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n" % (
        allowed.port,
        allowed.port,
    )


@pytest.fixture(scope="module")
def passed_attacks(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> dict[str, str]:
    """Every attack of :data:`ATTACKS` run once, inside; each one's log entry detail (one exec for all)."""
    allowed = servers[1]
    # The earlier tests' connections record their entries as their relays end, which may be after their
    # command did: counted from once none is live, they are not mistaken for these.
    wait_for(lambda: direct_live(runc_session) == 0)
    before, logged = len(allowed.received), len(runc_session.network_log().entries)
    code = f"TOKEN = {token_of(runc_session)!r}\nHEAD = {head_for(allowed)!r}\nATTACKS = {list(ATTACKS)!r}\n"
    result = python(runc_session, code + ATTACKER)
    assert result.stdout.strip() == '"done"', result
    wait_for(lambda: direct_live(runc_session) == 0)
    time.sleep(0.3)  # the server's threads record what they got
    assert allowed.received[before:] == []
    entries = runc_session.network_log().entries[logged:]
    assert all((entry.decision, entry.rule) == ("refused", PASSED_RULE) for entry in entries), entries
    assert len(entries) == len(ATTACKS), entries
    return dict(zip(ATTACKS, (entry.detail for entry in entries), strict=True))


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_passed_descriptor_that_is_not_a_loopback_tcp_client_is_refused(
    passed_attacks: dict[str, str], attack: str
) -> None:
    """Passing anything but one connected loopback TCP socket: nothing relayed, one refusal logged.

    Catches, in turn: a host that relays any passed descriptor (``pipe``, ``regular_file``: the request in
    them would reach the allowed server); one that checks "is a socket" only (``socketpair``: a Unix pair
    whose other end the attacker writes; ``netlink``); one that checks the family but not the type
    (``udp``); one that skips ``SO_ACCEPTCONN`` or ``getpeername`` (``listening``, ``unconnected``); one that
    takes the first of several descriptors (``two_sockets``: the second would stay open in the host); and
    one that falls back to relaying the Unix connection itself when no descriptor came (``no_descriptor``).
    The fixture checks the allowed server got nothing and the socket's live count went back to 0.
    """
    assert ATTACKS[attack] in passed_attacks[attack], passed_attacks


STEAL = (
    PASSED_PAIR
    + """
import fcntl, os, threading, time
def steal():  # blocking, with O_NONBLOCK cleared again before every read: the bytes the host polls for
    while True:
        flags = fcntl.fcntl(accepted, fcntl.F_GETFL)
        fcntl.fcntl(accepted, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        try:
            if not os.read(accepted.fileno(), 65536):
                return
        except OSError:
            return
threading.Thread(target=steal, daemon=True).start()
start = time.monotonic()
client.sendall(HEAD_START)
for _ in range(25):  # a byte at a time, never a whole head, then nothing more: a host blocked in recv stays
    client.sendall(b"a")
    time.sleep(0.02)
client.settimeout(WAIT)
try:
    answer = client.recv(200)
except OSError as error:
    answer = repr(error).encode()
print(round(time.monotonic() - start, 1), answer.split(b"\\r\\n")[0].decode(errors="replace"))
"""
)


def test_the_sandbox_stealing_the_passed_sockets_bytes_cannot_hold_the_host(
    runc_session: DockerSession, servers: tuple[BulkServer, Upstream, Upstream]
) -> None:
    """The sandbox keeps its copy of the passed socket, clears ``O_NONBLOCK`` and reads away what arrives.

    Catches a host that waits for the head with a blocking ``recv`` after ``poll`` (or Python's
    ``settimeout``, which relies on the shared ``O_NONBLOCK``): the bytes it was woken for are gone, it blocks
    for ever past its head deadline and holds a slot. Here the host still answers 408 once its (shortened)
    head deadline passes, and frees the slot.
    """
    allowed = servers[1]
    egress = runc_session._egress
    before, logged = len(allowed.received), len(runc_session.network_log().entries)
    head_start = b"GET http://allowed.test:%d/steal HTTP/1.1\r\nX-Slow: " % allowed.port
    egress.head_timeout = 2.0
    try:
        code = f"TOKEN = {token_of(runc_session)!r}\nHEAD_START = {head_start!r}\nWAIT = 30\n{STEAL}"
        result = python(runc_session, code)
    finally:
        egress.head_timeout = DEFAULT_HEAD_TIMEOUT
    elapsed, answer = result.stdout.split(" ", 1)
    assert "408" in answer, result
    assert float(elapsed) < 2.0 + 15, result  # does not hang: the deadline, with a generous margin
    wait_for(lambda: direct_live(runc_session) == 0)
    assert allowed.received[before:] == []
    entries = runc_session.network_log().entries[logged:]
    assert [(entry.decision, entry.rule) for entry in entries] == [("refused", "head timeout")], entries
