"""The server name of a ClientHello: real hellos from Python's ssl, hand-made attacks, and a fuzz."""

from __future__ import annotations

import random
import ssl
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adk_sandbox.executor.network.tls_hello import MAX_HELLO, ServerName, server_name


def client_hello(server_hostname: str | None, *, tls13: bool = True) -> bytes:
    """The first bytes a real TLS client sends (Python's ssl, through memory BIOs)."""
    context = ssl.create_default_context()
    if server_hostname is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if not tls13:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def record(body: bytes, kind: int = 22, version: bytes = b"\x03\x01") -> bytes:
    return bytes([kind]) + version + struct.pack(">H", len(body)) + body


def extension(kind: int, data: bytes) -> bytes:
    return struct.pack(">HH", kind, len(data)) + data


def sni(*names: bytes, name_type: int = 0) -> bytes:
    entries = b"".join(bytes([name_type]) + struct.pack(">H", len(n)) + n for n in names)
    return extension(0, struct.pack(">H", len(entries)) + entries)


def hello(
    *extensions: bytes, session_id: bytes = b"", suites: bytes = b"\x13\x01", trailing: bytes = b""
) -> bytes:
    """A hand-made ClientHello handshake message (header included)."""
    exts = b"".join(extensions)
    body = (
        b"\x03\x03"
        + bytes(32)
        + bytes([len(session_id)])
        + session_id
        + struct.pack(">H", len(suites))
        + suites
        + b"\x01\x00"
        + struct.pack(">H", len(exts))
        + exts
        + trailing
    )
    return b"\x01" + len(body).to_bytes(3, "big") + body


# -- real ClientHellos ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tls13", [True, False])
def test_a_real_hello_names_its_server(tls13: bool) -> None:
    data = client_hello("Files.PythonHosted.org", tls13=tls13)
    assert server_name(data) == ServerName(kind="found", name="files.pythonhosted.org")
    assert server_name(data + b"application data that follows") == server_name(data)


def test_a_real_hello_without_server_hostname_has_no_name() -> None:
    assert server_name(client_hello(None)) == ServerName(kind="absent")


def test_python_sends_no_sni_for_an_ip_address() -> None:
    assert server_name(client_hello("127.0.0.1")).kind == "absent"


def test_every_truncation_of_a_real_hello_asks_for_more_with_a_growing_bound() -> None:
    data = client_hello("pypi.org")
    needed = 0
    for cut in range(len(data)):
        answer = server_name(data[:cut])
        assert answer.kind == "need_more", cut
        assert cut < answer.needed <= len(data)
        assert answer.needed >= needed
        needed = answer.needed
    assert server_name(data).name == "pypi.org"


def test_a_hello_split_over_several_records_is_read_whole() -> None:
    message = client_hello("pypi.org")[5:]
    pieces = [message[i : i + 50] for i in range(0, len(message), 50)]
    data = b"".join(record(piece) for piece in pieces)
    assert server_name(data).name == "pypi.org"
    assert server_name(data[:-1]).kind == "need_more"
    one_byte_records = b"".join(record(message[i : i + 1]) for i in range(len(message)))
    answer = server_name(one_byte_records)
    # Each byte costs a 5-byte header: past MAX_HELLO the proxy stops reading.
    assert answer.kind == ("found" if len(one_byte_records) <= MAX_HELLO else "not_tls")


def test_a_trailing_dot_and_case_are_normalised() -> None:
    assert server_name(record(hello(sni(b"PyPI.Org.")))).name == "pypi.org"


# -- the attacks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "does not start with a TLS handshake"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "does not start with a TLS handshake"),
        (b"\x80\x2e\x01\x03\x01" + bytes(60), "does not start with a TLS handshake"),  # SSLv2
        (record(b"\x15\x02\x28", kind=21), "does not start with a TLS handshake"),  # an alert first
        (record(hello(sni(b"a.test")), version=b"\x02\x00"), "record version"),
        (record(hello(sni(b"a.test")), version=b"\x03\x09"), "record version"),
        (b"\x16\x03\x01\x00\x00", "record length of 0"),
        (b"\x16\x03\x01\x40\x01" + bytes(16385), "record length of 16385"),
        (record(b"\x02" + hello(sni(b"a.test"))[1:]), "not a ClientHello"),  # a ServerHello
        (record(hello(sni(b"a.test"))) + b"", "found"),
        (record(hello(sni(b"a.test")) + b"\x01\x00\x00\x00"), "hold more than the message"),
        (record(hello(sni(b"allowed.test", b"evil.test"))), "more than one server"),
        (record(hello(sni(b"allowed.test"), sni(b"evil.test"))), "repeats extension 0"),
        (record(hello(extension(10, b"\x00\x02\x00\x1d"), extension(10, b"\x00\x02\x00\x17"))), "repeats"),
        (record(hello(sni(b"evil.test\0.allowed.test"))), "not a plain ASCII host name"),
        (record(hello(sni(b"b\xc3\xbccher.test"))), "not a plain ASCII host name"),
        (record(hello(sni(b"a.test/x"))), "not a plain ASCII host name"),
        (record(hello(sni(b""))), "not a plain ASCII host name"),
        (record(hello(sni(b"a" * 254))), "not a plain ASCII host name"),
        (record(hello(session_id=bytes(33))), "session id"),
        (record(hello(suites=b"")), "cipher suite"),
        (record(hello(suites=b"\x13")), "cipher suite"),
        (record(hello(sni(b"a.test"), trailing=b"\x00")), "bytes follow the ClientHello's extensions"),
        (record(hello(extension(0, b"\x00\x05\x00\x00\x02ab\xff"))), "bytes follow the server_name list"),
        (record(hello(extension(0, b"\x00\x09\x00\x00\x02ab"))), "runs past"),
        (record(b"\x01\x00\x00\x00"), "runs past"),
        (record(b"\x01\x00\x00\x10" + bytes(16)), "runs past"),
    ],
)
def test_malformed_or_hostile_hellos_are_not_tls(data: bytes, says: str) -> None:
    answer = server_name(data)
    if says == "found":
        assert answer.kind == "found"
        return
    assert answer.kind == "not_tls"
    assert says in answer.reason


def test_a_name_of_another_type_is_not_a_host_name() -> None:
    assert server_name(record(hello(sni(b"a.test", name_type=1)))) == ServerName(kind="absent")


def test_a_hello_without_extensions_has_no_name() -> None:
    message = hello()
    no_extensions = message[:-2]  # drop the empty extensions vector
    no_extensions = b"\x01" + (len(no_extensions) - 4).to_bytes(3, "big") + no_extensions[4:]
    assert server_name(record(no_extensions)) == ServerName(kind="absent")


def test_a_hello_too_large_to_read_is_refused_before_it_is_read() -> None:
    big = hello(extension(21, bytes(20000)))  # padding past what the proxy reads
    first = record(big[:16000])
    second_header = b"\x16\x03\x01" + struct.pack(">H", 4000)
    answer = server_name(first + second_header)
    assert answer.kind == "not_tls"
    assert "longer than" in answer.reason


# -- no input makes it raise ---------------------------------------------------------------------------
@given(st.binary(max_size=2000))
@settings(max_examples=500, deadline=None)
def test_random_bytes_never_raise(data: bytes) -> None:
    answer = server_name(data)
    assert answer.kind in ("found", "absent", "not_tls", "need_more")
    if answer.kind == "need_more":
        assert len(data) < answer.needed <= MAX_HELLO


@given(st.binary(max_size=600))
@settings(max_examples=500, deadline=None)
def test_random_bytes_inside_a_valid_record_never_raise(body: bytes) -> None:
    answer = server_name(record(b"\x01" + len(body).to_bytes(3, "big") + body))
    assert answer.kind in ("found", "absent", "not_tls")


def test_mutations_and_truncations_of_a_real_hello_never_raise() -> None:
    rng = random.Random(23)
    good = client_hello("pypi.org")
    kinds = set()
    for _ in range(5000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        cut = rng.randint(0, len(data))
        answer = server_name(bytes(data[:cut]))
        kinds.add(answer.kind)
        if answer.kind == "found":
            assert answer.name == answer.name.lower()
    assert {"need_more", "not_tls", "found"} <= kinds
