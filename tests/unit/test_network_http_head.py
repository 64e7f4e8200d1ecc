"""The proxy's request head: what it accepts, what it refuses (hostile input), and its short answers."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adk_sandbox.executor.network.http_head import (
    MAX_HEAD,
    MAX_HEADER_LINES,
    MAX_LINE,
    HeadError,
    ProxyRequest,
    bad_gateway,
    bad_request,
    connection_established,
    forbidden,
    gateway_timeout,
    head_end,
    parse_head,
    request_timeout,
    response,
)
from adk_sandbox.executor.network.policy import NetworkPolicy


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# -- accepted -----------------------------------------------------------------------------------------
def test_connect_parses() -> None:
    request = parse_head(head("CONNECT PyPI.org.:443 HTTP/1.1", "Host: pypi.org:443", "User-Agent: curl/8"))
    assert request == ProxyRequest(
        method="CONNECT",
        host="pypi.org",
        port=443,
        target="PyPI.org.:443",
        version="HTTP/1.1",
        headers=(("Host", "pypi.org:443"), ("User-Agent", "curl/8")),
        path="",
    )
    assert request.is_connect
    assert request.authority == "pypi.org:443"


def test_connect_with_a_portless_host_header_and_without_one() -> None:
    assert parse_head(head("CONNECT a.test:8443 HTTP/1.1", "Host: a.test")).port == 8443
    assert parse_head(head("CONNECT a.test:443 HTTP/1.0")).host == "a.test"


def test_connect_to_an_ipv6_literal_parses_so_the_policy_can_refuse_it() -> None:
    request = parse_head(head("CONNECT [::FFFF:127.0.0.1]:443 HTTP/1.1"))
    assert request.host == "::ffff:7f00:1"
    assert request.authority == "[::ffff:7f00:1]:443"
    decision = NetworkPolicy(allow=["*"]).decide(request.host, request.port)
    assert not decision.allowed


@pytest.mark.parametrize("target", ["127.0.0.1:443", "2130706433:443", "0x7f.1:443", "0177.0.0.1:443"])
def test_connect_to_an_ip_literal_parses_and_the_policy_refuses_it(target: str) -> None:
    request = parse_head(head(f"CONNECT {target} HTTP/1.1"))
    decision = NetworkPolicy(allow=["*"]).decide(request.host, request.port)
    assert (decision.allowed, decision.rule) == (False, "not a host name")


def test_an_absolute_http_request_is_forwarded_in_origin_form_without_hop_by_hop_headers() -> None:
    request = parse_head(
        head(
            "POST http://Api.Test:8080/v1/items?q=1#frag HTTP/1.1",
            "Host: api.test:8080",
            "Proxy-Connection: keep-alive",
            "Proxy-Authorization: Basic eA==",
            "Connection: keep-alive, X-Private",
            "X-Private: drop me",
            "Keep-Alive: 5",
            "TE: trailers",
            "Upgrade: h2c",
            "Content-Length: 2",
            "Accept: */*",
        )
    )
    assert (request.method, request.host, request.port, request.path) == (
        "POST",
        "api.test",
        8080,
        "/v1/items?q=1",
    )
    assert not request.is_connect
    assert request.forward_head() == head(
        "POST /v1/items?q=1 HTTP/1.1",
        "Host: api.test:8080",
        "Content-Length: 2",
        "Accept: */*",
        "Connection: close",
    )


def test_the_forwarded_head_takes_injected_headers_over_the_clients() -> None:
    request = parse_head(head("GET http://a.test HTTP/1.1", "Authorization: forged", "Accept: */*"))
    assert request.path == "/"
    assert request.forward_head({"Authorization": "Bearer real"}) == head(
        "GET / HTTP/1.1", "Host: a.test", "Accept: */*", "Authorization: Bearer real", "Connection: close"
    )


def test_a_query_without_a_path_and_a_default_port() -> None:
    request = parse_head(head("GET http://a.test?x=1 HTTP/1.0", "Host: a.test:80"))
    assert (request.path, request.port, request.version) == ("/?x=1", 80, "HTTP/1.0")


def test_a_connect_head_is_not_forwarded() -> None:
    with pytest.raises(HeadError, match="tunnel"):
        parse_head(head("CONNECT a.test:443 HTTP/1.1")).forward_head()


def test_obs_text_in_a_value_survives() -> None:
    request = parse_head(b"GET http://a.test/ HTTP/1.1\r\nX-Name: caf\xe9\r\n\r\n")
    assert request.headers == (("X-Name", "caf\xe9"),)
    assert b"X-Name: caf\xe9\r\n" in request.forward_head()


# -- refused: the attacks and the garbage --------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "says"),
    [
        # The bypasses of the issue.
        (head("GET http://allowed.test/ HTTP/1.1", "Host: evil.test"), "Host header names 'evil.test'"),
        (head("GET http://allowed.test/ HTTP/1.1", "Host: allowed.test:8080"), "must agree"),
        (head("CONNECT allowed.test:443 HTTP/1.1", "Host: evil.test:443"), "must agree"),
        (head("GET http://a.test/ HTTP/1.1", "Host: a.test", "Host: evil.test"), "several Host"),
        (head("GET http://allowed.test@evil.test/ HTTP/1.1"), "user info"),
        (head("CONNECT user@evil.test:443 HTTP/1.1"), "user info"),
        (head("GET /path HTTP/1.1", "Host: a.test"), "a proxy needs the absolute URI"),
        (head("GET https://a.test/ HTTP/1.1"), "for https use CONNECT"),
        (head("GET ftp://a.test/ HTTP/1.1"), "scheme 'ftp'"),
        (head("GET http://a%2etest/ HTTP/1.1"), "does not name a host"),
        (head("GET http:///x HTTP/1.1"), "does not name a host"),
        (head("CONNECT a.test HTTP/1.1"), "has no port"),
        (head("CONNECT a.test:0 HTTP/1.1"), "port '0'"),
        (head("CONNECT a.test:65536 HTTP/1.1"), "port '65536'"),
        (head("CONNECT a.test:99999999 HTTP/1.1"), "port"),
        (head("CONNECT a.test:https HTTP/1.1"), "port 'https'"),
        (head("CONNECT a.test:-1 HTTP/1.1"), "port"),
        (head("CONNECT a.test:443:80 HTTP/1.1"), "port"),
        (head("CONNECT a.test:+443 HTTP/1.1"), "port"),
        (head("CONNECT [::1 HTTP/1.1"), "bracketed IPv6"),
        (head("CONNECT [::1]x:443 HTTP/1.1"), "unexpected"),
        (head("CONNECT [1::2::3]:443 HTTP/1.1"), "not a valid IPv6"),
        (head("CONNECT [fe80::1%25eth0]:443 HTTP/1.1"), "bracketed IPv6"),
        # Request smuggling.
        (head("POST http://a.test/ HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked"), "together"),
        (head("POST http://a.test/ HTTP/1.1", "Content-Length: 3", "Content-Length: 4"), "different"),
        (head("POST http://a.test/ HTTP/1.1", "Content-Length: -3"), "not a number"),
        (head("GET http://a.test/ HTTP/1.1", "X-A: 1", " folded"), "folded"),
        (head("GET http://a.test/ HTTP/1.1", "Host : a.test"), "malformed header"),
        (head("GET http://a.test/ HTTP/1.1", "no colon"), "malformed header"),
        (b"GET http://a.test/ HTTP/1.1\r\nX-A: 1\nHost: evil.test\r\n\r\n", "bare CR or LF"),
        (b"GET http://a.test/ HTTP/1.1\r\nX-A: 1\rHost: evil.test\r\n\r\n", "bare CR or LF"),
        (b"GET http://a.test/ HTTP/1.1\r\nX-A: a\x01b\r\n\r\n", "control character"),
        (b"GET http://a.test/ HTTP/1.1\r\nX-A: a\0b\r\n\r\n", "NUL"),
        (b"CONNECT a.test\0.evil:443 HTTP/1.1\r\n\r\n", "NUL"),
        # Garbage request lines.
        (head("GET  http://a.test/ HTTP/1.1"), "malformed request line"),
        (head("GET http://a.test/"), "malformed request line"),
        (head("CONNECT a.test:443 HTTP/2"), "unsupported version"),
        (head("CONNECT a.test:443 HTTP/1.1 extra"), "malformed request line"),
        (head("G(T http://a.test/ HTTP/1.1"), "malformed method"),
        (b"GET http://a.test/\xff HTTP/1.1\r\n\r\n", "control or non-ASCII"),
        (head(""), "malformed request line"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "NUL"),  # TLS sent to the proxy itself
        (b"\x16\x03\x01\x02\x01\x01\x01\x01\xfc\x03\x03\r\n\r\n", "malformed request line"),
        (b"GET http://a.test/ HTTP/1.1\r\n", "does not end with an empty line"),
        (b"GET http://a.test/ HTTP/1.1\n\n", "does not end with an empty line"),
    ],
)
def test_bad_heads_are_refused_with_a_reason(data: bytes, says: str) -> None:
    with pytest.raises(HeadError) as caught:
        parse_head(data)
    assert says in str(caught.value)


def test_too_many_header_lines_are_refused() -> None:
    lines = [f"X-{i}: {i}" for i in range(MAX_HEADER_LINES)]
    assert len(parse_head(head("GET http://a.test/ HTTP/1.1", *lines)).headers) == MAX_HEADER_LINES
    with pytest.raises(HeadError, match="more than 100 header lines"):
        parse_head(head("GET http://a.test/ HTTP/1.1", *lines, "X-One: more"))


def test_an_overlong_line_is_refused() -> None:
    with pytest.raises(HeadError, match="longer than 8192"):
        parse_head(head("GET http://a.test/ HTTP/1.1", "X-A: " + "a" * MAX_LINE))
    with pytest.raises(HeadError, match="longer than 8192"):
        head_end(b"CONNECT " + b"a" * MAX_LINE)


def test_head_end_waits_then_cuts_and_stops_at_the_bound() -> None:
    whole = head("CONNECT a.test:443 HTTP/1.1", "Host: a.test")
    for cut in range(len(whole)):
        assert head_end(whole[:cut]) is None
    assert head_end(whole) == len(whole)
    assert head_end(whole + b"\x16\x03\x01 early TLS bytes") == len(whole)
    # An oversized CONNECT: headers within the line bound, the head past its own.
    big = b"CONNECT a.test:443 HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 8000 + b"\r\n"
    with pytest.raises(HeadError, match="longer than 16384"):
        head_end(big * 3)
    exact = head("GET http://a.test/ HTTP/1.1", *["X-A: " + "a" * 1000] * 15)
    exact = exact[:-4] + b"X" * (MAX_HEAD - len(exact)) + b"\r\n\r\n"
    assert len(exact) == MAX_HEAD
    assert head_end(exact) == MAX_HEAD
    over = exact[:-4] + b"X\r\n\r\n"
    with pytest.raises(HeadError, match="longer than 16384"):
        head_end(over)
    with pytest.raises(HeadError, match="longer than 16384"):
        parse_head(over)


@given(st.binary(max_size=600))
@settings(max_examples=400, deadline=None)
def test_no_bytes_raise_anything_but_head_error(data: bytes) -> None:
    for candidate in (data, data + b"\r\n\r\n", b"CONNECT " + data + b"\r\n\r\n", b"GET http://" + data):
        try:
            end = head_end(candidate)
            if end is not None:
                parse_head(candidate[:end])
        except HeadError:
            pass


@given(st.text(alphabet=st.characters(codec="latin-1"), max_size=200))
@settings(max_examples=300, deadline=None)
def test_no_text_in_a_valid_frame_raises_anything_but_head_error(text: str) -> None:
    for line in (
        f"CONNECT {text} HTTP/1.1",
        f"GET http://{text} HTTP/1.1",
        f"GET http://a.test/ HTTP/1.1\r\n{text}",
    ):
        with contextlib.suppress(HeadError):
            parse_head((line + "\r\n\r\n").encode("latin-1"))


def test_mutated_good_heads_never_raise_anything_else() -> None:
    rng = random.Random(23)
    good = head("GET http://a.test:8080/x HTTP/1.1", "Host: a.test:8080", "Content-Length: 0")
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        with contextlib.suppress(HeadError):
            parse_head(bytes(data))


# -- the short answers ---------------------------------------------------------------------------------
def parse_response(data: bytes) -> tuple[str, dict[str, str], bytes]:
    top, _, body = data.partition(b"\r\n\r\n")
    status, *lines = top.decode("ascii").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    if "Content-Length" in headers:
        assert int(headers["Content-Length"]) == len(body)
    return status, headers, body


def test_the_answers_are_well_formed_and_say_why() -> None:
    assert connection_established() == b"HTTP/1.1 200 Connection established\r\n\r\n"
    status, headers, body = parse_response(
        forbidden("the policy refused evil.test:443: no", "no rule allows it")
    )
    assert status == "HTTP/1.1 403 Forbidden"
    assert headers["Connection"] == "close"
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert body == b"the policy refused evil.test:443: no\nrule: no rule allows it\n"
    for answer, code in (
        (bad_request("bad port"), "400"),
        (bad_gateway("no route"), "502"),
        (gateway_timeout("10 s"), "504"),
        (request_timeout(10), "408"),
    ):
        status, _, body = parse_response(answer)
        assert status.split(" ")[1] == code
        assert body
    assert b"bad port" in bad_request("bad port")
    assert parse_response(response(204, "No Content")) == (
        "HTTP/1.1 204 No Content",
        {"Connection": "close", "Content-Length": "0"},
        b"",
    )
    assert "é".encode() in forbidden("café.test", "r")
