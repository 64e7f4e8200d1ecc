"""Which Docker engine a backend talks to, and the one way raw connections to it are made.

:class:`Engine` names a daemon (Unix socket, TCP with TLS, SSH); :func:`resolve_engine` picks the one the
Docker CLI would use and refuses unsafe ones; :meth:`Engine.dial` makes every raw connection, bridging a
long-lived TLS stream to a local socket pair. Depth: docs/docker/engines.md, "Engines" (local or remote, TLS).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import ipaddress
import json
import os
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adk_sandbox.executor.errors import BackendUnavailableError, InvalidRequestError

__all__ = ["DEFAULT_HOST", "Engine", "EngineKind", "engine_from_context", "engine_from_env", "resolve_engine"]

DEFAULT_HOST = "unix:///var/run/docker.sock"
EngineKind = Literal["unix", "tcp", "ssh"]

#: Bytes the bridge holds in each direction before it stops reading that side (back-pressure).
_BRIDGE_BUFFER = 1 << 20
_READ_SIZE = 65536


class Engine(BaseModel):
    """A Docker engine to talk to: its address and, for TCP, the TLS files that authenticate both sides.

    >>> Engine(host="unix:///var/run/docker.sock").local
    True
    >>> Engine(host="tcp://127.0.0.1:2375").kind
    'tcp'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(DEFAULT_HOST, min_length=1)
    """``unix:///path``, ``tcp://host:port`` or ``ssh://[user@]host[:port]``, as in ``DOCKER_HOST``."""
    tls_verify: bool = False
    """TCP only: speak TLS and verify the engine's certificate against :attr:`ca_cert`."""
    ca_cert: Path | None = None
    """The CA that signed the engine's certificate (``ca.pem``)."""
    client_cert: Path | None = None
    """This client's certificate (``cert.pem``), which an engine started with ``--tlsverify`` requires."""
    client_key: Path | None = None
    """The key of :attr:`client_cert` (``key.pem``)."""
    context: str | None = None
    """The Docker context this engine came from, when it came from one (reported, not used)."""

    @model_validator(mode="after")
    def _check(self) -> Engine:
        parts = urlsplit(self.host)
        if parts.scheme not in ("unix", "tcp", "ssh"):
            raise ValueError(
                f"engine host {self.host!r} must start with unix://, tcp:// or ssh:// (as DOCKER_HOST does)"
            )
        if parts.scheme == "unix" and not parts.path:
            raise ValueError(f"engine host {self.host!r} names no socket path")
        if parts.scheme in ("tcp", "ssh") and not parts.hostname:
            raise ValueError(f"engine host {self.host!r} names no host")
        if parts.scheme == "tcp" and parts.port is None:
            raise ValueError(f"engine host {self.host!r} names no port (2376 is the usual one for TLS)")
        tls_files = (self.ca_cert, self.client_cert, self.client_key)
        if parts.scheme != "tcp" and (self.tls_verify or any(tls_files)):
            raise ValueError("TLS settings apply to tcp:// engines only")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        if self.tls_verify and self.ca_cert is None:
            raise ValueError("tls_verify needs ca_cert, the CA that signed the engine's certificate")
        if parts.scheme == "tcp" and not self.tls_verify:
            if any(tls_files):
                raise ValueError(
                    "TLS without verifying the engine's certificate is refused: set tls_verify "
                    "(DOCKER_TLS_VERIFY=1) with the engine's CA"
                )
            if not _is_loopback(parts.hostname or ""):
                raise ValueError(
                    f"engine host {self.host!r} is TCP without TLS: an unauthenticated engine on a network "
                    "is root for anyone who reaches it; use TLS (tls_verify with ca_cert, client_cert and "
                    "client_key, or DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH) or ssh://"
                )
        for path in tls_files:
            if path is not None and not path.is_file():
                raise ValueError(f"TLS file {path} does not exist")
        return self

    # -- what it is ----------------------------------------------------------------------------------
    @property
    def kind(self) -> EngineKind:
        """``"unix"``, ``"tcp"`` or ``"ssh"``."""
        scheme = urlsplit(self.host).scheme
        return "unix" if scheme == "unix" else "tcp" if scheme == "tcp" else "ssh"

    @property
    def local(self) -> bool:
        """True for a Unix-socket engine: one that may share this machine's files (a probe proves it)."""
        return self.kind == "unix"

    @property
    def machine(self) -> str | None:
        """The host name (or address) of a TCP or SSH engine's machine; None for a local Unix socket.

        >>> Engine(host="ssh://me@build.example:2222").machine
        'build.example'
        """
        return None if self.kind == "unix" else urlsplit(self.host).hostname

    @property
    def socket_path(self) -> str | None:
        """The Unix socket of a local engine (None for TCP and SSH)."""
        return urlsplit(self.host).path if self.kind == "unix" else None

    def describe(self) -> str:
        """How the engine is named in messages: its host, and its context when it came from one."""
        via = f" (context {self.context!r})" if self.context else ""
        tls = " over TLS" if self.tls_verify else ""
        return f"{self.host}{tls}{via}"

    # -- connecting ----------------------------------------------------------------------------------
    def client_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.DockerClient`` (``base_url``, ``tls``, ``use_ssh_client``)."""
        if self.kind == "ssh":
            _require_paramiko()
            # Never the ssh binary mode: it breaks exec start (docker-py#3218); paramiko mode works.
            return {"base_url": self.host, "use_ssh_client": False}
        if self.kind == "tcp" and self.tls_verify:
            import docker.tls  # noqa: PLC0415 - only TLS engines need it

            cert = (str(self.client_cert), str(self.client_key)) if self.client_cert else None
            tls = docker.tls.TLSConfig(client_cert=cert, ca_cert=str(self.ca_cert), verify=True)
            return {"base_url": self.host, "tls": tls}
        return {"base_url": self.host}

    def dial(self, timeout: float, *, stream: bool = False) -> socket.socket:
        """A raw connection to the engine's API, connected (and TLS-authenticated) within ``timeout``.

        ``stream`` asks for a connection that becomes a long-lived stream used from several threads and
        under ``select`` (a hijacked exec): a TLS one is then bridged (see the module docstring). Without
        it, a TLS connection is the ``ssl.SSLSocket`` itself, for one blocking request and answer.
        Connection failures raise :class:`BackendUnavailableError`; a timeout ``TimeoutError``.
        """
        kind = self.kind
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.socket_path or "")
            except BaseException:
                sock.close()
                raise
            return sock
        if kind == "ssh":
            return _bridge(_SshChannel.open(self, timeout))
        parts = urlsplit(self.host)
        address = (parts.hostname or "", parts.port or 0)
        raw = socket.create_connection(address, timeout=timeout)
        if not self.tls_verify:
            return raw
        try:
            tls = self._tls_context().wrap_socket(raw, server_hostname=parts.hostname)
        except ssl.SSLCertVerificationError as exc:
            raw.close()
            raise BackendUnavailableError(
                f"the Docker engine at {self.describe()} presented a certificate that does not verify "
                f"against {self.ca_cert} ({exc.verify_message}); check DOCKER_CERT_PATH / the context's CA"
            ) from exc
        except ssl.SSLError as exc:
            raw.close()
            raise BackendUnavailableError(
                f"the TLS handshake with the Docker engine at {self.describe()} failed ({exc}); the engine "
                "may require a client certificate this client does not have"
            ) from exc
        except BaseException:
            raw.close()
            raise
        return _bridge(_TlsEnd(tls)) if stream else tls

    def _tls_context(self) -> ssl.SSLContext:
        # Built from the engine's own files only: never the environment's CA bundle (REQUESTS_CA_BUNDLE,
        # SSL_CERT_FILE are for web servers, not for the engine a user named).
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cafile=str(self.ca_cert))
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _require_paramiko() -> Any:
    """The paramiko module (an optional dependency: the ``ssh`` extra), untyped here (it ships no types)."""
    try:
        return importlib.import_module("paramiko")
    except ImportError as exc:
        raise BackendUnavailableError(
            "an ssh:// Docker engine needs paramiko: pip install 'adk-sandbox[ssh]'"
        ) from exc


# -- choosing the engine -------------------------------------------------------------------------------
def engine_from_env(environ: Mapping[str, str] | None = None) -> Engine:
    """The engine the Docker CLI would use in this environment (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST", "")
    if host:
        return _engine_from_host(host, env)
    name = env.get("DOCKER_CONTEXT", "") or _current_context(env)
    if name and name != "default":
        return engine_from_context(name, environ=env)
    return Engine()


def _engine_from_host(host: str, env: Mapping[str, str]) -> Engine:
    verify = env.get("DOCKER_TLS_VERIFY", "") not in ("", "0")
    cert_path = env.get("DOCKER_CERT_PATH", "")
    arguments: dict[str, Any] = {"host": host}
    if host.startswith("tcp://") and (verify or cert_path):
        if not verify:
            raise InvalidRequestError(
                "DOCKER_CERT_PATH is set without DOCKER_TLS_VERIFY: TLS that does not verify the engine's "
                "certificate is refused; set DOCKER_TLS_VERIFY=1"
            )
        directory = Path(cert_path) if cert_path else _config_dir(env)
        arguments |= {"tls_verify": True, "ca_cert": directory / "ca.pem"}
        if (directory / "cert.pem").exists() or (directory / "key.pem").exists():
            arguments |= {"client_cert": directory / "cert.pem", "client_key": directory / "key.pem"}
    return _validated(arguments, "DOCKER_HOST")


def engine_from_context(name: str, *, environ: Mapping[str, str] | None = None) -> Engine:
    """The engine of the Docker context ``name`` (``docker context create``'s metadata and TLS files)."""
    env = os.environ if environ is None else environ
    if name == "default":
        return _engine_from_host(env.get("DOCKER_HOST", "") or DEFAULT_HOST, env)
    digest = hashlib.sha256(name.encode()).hexdigest()
    contexts = _config_dir(env) / "contexts"
    meta_path = contexts / "meta" / digest / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        endpoint = meta["Endpoints"]["docker"]
        host = str(endpoint["Host"])
    except FileNotFoundError:
        raise InvalidRequestError(
            f"there is no Docker context {name!r} (no {meta_path}); `docker context ls` lists them"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(
            f"the Docker context {name!r} cannot be read ({meta_path}: {exc!r})"
        ) from exc
    arguments: dict[str, Any] = {"host": host, "context": name}
    tls = contexts / "tls" / digest / "docker"
    if host.startswith("tcp://") and (tls / "ca.pem").exists():
        if endpoint.get("SkipTLSVerify"):
            raise InvalidRequestError(
                f"the Docker context {name!r} skips verifying the engine's certificate (SkipTLSVerify), "
                "which is refused: recreate it with the engine's CA"
            )
        arguments |= {"tls_verify": True, "ca_cert": tls / "ca.pem"}
        if (tls / "cert.pem").exists():
            arguments |= {"client_cert": tls / "cert.pem", "client_key": tls / "key.pem"}
    return _validated(arguments, f"the Docker context {name!r}")


def resolve_engine(engine: Engine | str | None = None) -> Engine:
    """The engine to use: ``engine`` itself, a URL (``unix://``, ``tcp://``, ``ssh://``) or a context name.

    None means the environment's (:func:`engine_from_env`). A ``tcp://`` URL takes its TLS files from
    ``DOCKER_TLS_VERIFY`` / ``DOCKER_CERT_PATH``, as ``docker -H`` does; give an :class:`Engine` to name
    them explicitly.
    """
    if isinstance(engine, Engine):
        return engine
    if engine is None:
        return engine_from_env()
    if "://" in engine:
        return _engine_from_host(engine, os.environ)
    return engine_from_context(engine)


def _validated(arguments: dict[str, Any], source: str) -> Engine:
    from pydantic import ValidationError  # noqa: PLC0415 - only on this path

    try:
        return Engine(**arguments)
    except ValidationError as exc:
        reasons = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        raise InvalidRequestError(f"{source} names an engine that cannot be used: {reasons}") from None


def _config_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("DOCKER_CONFIG", "") or Path.home() / ".docker")


def _current_context(env: Mapping[str, str]) -> str:
    try:
        config = json.loads((_config_dir(env) / "config.json").read_text())
    except (OSError, ValueError):
        return ""
    current = config.get("currentContext") if isinstance(config, dict) else None
    return current if isinstance(current, str) else ""


# -- the bridge ----------------------------------------------------------------------------------------
class _TlsEnd:
    """The engine side of a bridge over TLS: non-blocking reads that drain what OpenSSL holds."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        tls.setblocking(False)
        self.sock = tls
        self._closed_write = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self) -> bytes | None:
        """Bytes available now (b"" at the end of the stream, None when nothing is ready).

        Reads until OpenSSL wants more from the network, so nothing is left in ``pending()``, where
        ``poll()`` on the descriptor would never see it.
        """
        data = bytearray()
        try:
            while len(data) < _BRIDGE_BUFFER:
                chunk = self.sock.recv(_READ_SIZE)
                if not chunk:
                    return bytes(data)  # the end: whatever came before it first, then b""
                data += chunk
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except ssl.SSLZeroReturnError:
            return bytes(data)
        return bytes(data) if data else None

    def pending(self) -> bool:
        return self.sock.pending() > 0

    def send(self, data: bytes) -> int:
        try:
            return self.sock.send(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return 0

    def close_write(self) -> None:
        """End of the caller's stream: TLS's close_notify, which the engine reads as the end of stdin."""
        if self._closed_write:
            return
        self._closed_write = True
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLWantWriteError, OSError, ValueError):
            # The first SSL_shutdown sends close_notify; the second, waiting for the engine's, would block:
            # on this non-blocking socket it raises instead, and reading goes on.
            self.sock.unwrap()

    def close(self) -> None:
        self.sock.close()


class _SshChannel:
    """The engine side of a bridge over SSH: ``docker system dial-stdio`` on the engine's host (paramiko).

    Each dial is a new channel on one of this process's SSH connections to the engine (see
    :func:`_ssh_connection`), so a dial costs a channel open, not an SSH handshake.
    """

    def __init__(self, channel: Any, connection: _SshConnection) -> None:
        self.channel = channel
        self._connection: _SshConnection | None = connection

    @classmethod
    def open(cls, engine: Engine, timeout: float) -> _SshChannel:
        paramiko = _require_paramiko()
        dead_connections = 0
        while True:
            try:
                connection = _ssh_connection(engine, timeout, paramiko)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise BackendUnavailableError(
                    f"could not reach the Docker engine at {engine.describe()} over ssh: {exc}"
                ) from exc
            try:
                channel = connection.client.get_transport().open_session(timeout=timeout)
                channel.exec_command("docker system dial-stdio")
            except (paramiko.SSHException, OSError, EOFError) as exc:
                shared = connection.channels > 1
                connection.release()
                if not connection.active() and dead_connections == 0:
                    # The cached connection had died (the server dropped it while it sat idle): a
                    # connection is only known dead once used. Dropped, and the dial made once more on a
                    # fresh one; a second dead one is a real failure.
                    dead_connections += 1
                    connection.full = True
                    continue
                if shared:
                    # sshd counts a session as open until its side of the close is done (its
                    # dial-stdio has exited), so a connection can be full before this count says so:
                    # no more channels on it; the next try takes (or makes) another connection.
                    connection.full = True
                    continue
                raise BackendUnavailableError(
                    f"the ssh server of the Docker engine at {engine.describe()} refused a channel running "
                    f"`docker system dial-stdio` ({exc}); it needs the docker CLI on that host"
                ) from exc
            channel.setblocking(False)
            return cls(channel, connection)

    def fileno(self) -> int:
        return int(self.channel.fileno())  # readable when data (or the end) is buffered

    def recv(self) -> bytes | None:
        if self.channel.recv_ready():
            return bytes(self.channel.recv(_READ_SIZE))
        return b"" if self.channel.closed or self.channel.eof_received else None

    def pending(self) -> bool:
        return bool(self.channel.recv_ready())

    def send(self, data: bytes) -> int:
        if self.channel.closed:
            raise BrokenPipeError("the ssh channel to the Docker engine closed")
        try:
            return int(self.channel.send(data))
        except TimeoutError:  # the channel's window is full: later
            return 0

    def close_write(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.release()


#: Channels open at once on one SSH connection: sshd allows 10 by default (``MaxSessions``); more
#: concurrent streams (sessions' agents, execs) go over further connections.
_CHANNELS_PER_CONNECTION = 8


class _SshConnection:
    """One SSH connection to an engine's host and how many of this process's channels use it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.channels = 0
        self.full = False
        """Set when the server refused a channel below the count: no new channel goes over it."""

    def active(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and bool(transport.is_active())

    def release(self) -> None:
        with _ssh_lock:
            self.channels -= 1


_ssh_pools: dict[str, list[_SshConnection]] = {}
_ssh_lock = threading.Lock()


def _ssh_connection(engine: Engine, timeout: float, paramiko: Any) -> _SshConnection:
    """A live SSH connection to ``engine`` with room for one more channel (counted as taken).

    Host, port, user, identity file and proxy command come from ``~/.ssh/config`` as docker-py's paramiko
    mode reads them; host keys from the system's known hosts (an unknown host is rejected).
    """
    with _ssh_lock:
        pool = _ssh_pools.setdefault(engine.host, [])
        for dead in [c for c in pool if not c.active() or (c.full and c.channels == 0)]:
            pool.remove(dead)
            dead.client.close()
        for connection in pool:
            if connection.channels < _CHANNELS_PER_CONNECTION and not connection.full:
                connection.channels += 1
                return connection
        parts = urlsplit(engine.host)
        parameters: dict[str, Any] = {
            "hostname": parts.hostname,
            "port": parts.port or 22,
            "username": parts.username,
        }
        config_file = Path("~/.ssh/config").expanduser()
        if config_file.exists():
            config = paramiko.SSHConfig.from_path(str(config_file)).lookup(parts.hostname or "")
            if "proxycommand" in config:
                parameters["sock"] = paramiko.ProxyCommand(config["proxycommand"])
            parameters["hostname"] = config.get("hostname", parameters["hostname"])
            if parts.port is None and "port" in config:
                parameters["port"] = int(config["port"])
            if parts.username is None and "user" in config:
                parameters["username"] = config["user"]
            if "identityfile" in config:
                parameters["key_filename"] = config["identityfile"]
        client = paramiko.SSHClient()
        client.load_system_host_keys()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(**parameters, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
        except BaseException:
            client.close()
            raise
        connection = _SshConnection(client)
        connection.channels = 1
        pool.append(connection)
        return connection


def _bridge(remote: _TlsEnd | _SshChannel) -> socket.socket:
    """One end of a local socket pair whose other end a thread joins to ``remote`` (both directions)."""
    local, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    thread = threading.Thread(
        target=_pump, args=(inner, remote), name="adk-sandbox-engine-bridge", daemon=True
    )
    thread.start()
    return local


def _pump(inner: socket.socket, remote: _TlsEnd | _SshChannel) -> None:  # noqa: PLR0912, PLR0915
    """Move bytes both ways until both directions ended, or either side broke or the caller closed."""
    inner.setblocking(False)
    up = bytearray()  # caller -> engine
    down = bytearray()  # engine -> caller
    caller_open = engine_open = True
    inner_shut = False
    poller = select.poll()  # not select(): descriptors above 1023 in a busy process
    try:
        while True:
            if engine_open and len(down) < _BRIDGE_BUFFER:
                try:
                    data = remote.recv()
                except OSError:
                    return  # the connection broke: closing the caller's end says so
                if data is not None:
                    down += data
                    engine_open = bool(data)
            if down:
                try:
                    del down[: inner.send(down)]
                except BlockingIOError:
                    pass
                except OSError:
                    return  # the caller closed its end
            if not engine_open and not down and not inner_shut:
                inner_shut = True
                with contextlib.suppress(OSError):
                    inner.shutdown(socket.SHUT_WR)  # the caller reads the end of the stream
            if caller_open and len(up) < _BRIDGE_BUFFER:
                try:
                    data = inner.recv(_READ_SIZE)
                except BlockingIOError:
                    pass
                except OSError:
                    return
                else:
                    if data:
                        up += data
                    else:
                        caller_open = False
            if up:
                try:
                    del up[: remote.send(bytes(up))]
                except OSError:
                    return
            if not caller_open and not up:
                remote.close_write()
            if not caller_open and not up and not engine_open and not down:
                return
            if remote.pending() and len(down) < _BRIDGE_BUFFER:
                continue  # decrypted bytes wait in the TLS object: poll() would never report them
            caller_events = select.POLLIN if caller_open and len(up) < _BRIDGE_BUFFER else 0
            engine_events = select.POLLIN if engine_open and len(down) < _BRIDGE_BUFFER else 0
            poller.register(inner, caller_events | (select.POLLOUT if down else 0))
            poller.register(remote.fileno(), engine_events | (select.POLLOUT if up else 0))
            # A paramiko channel's descriptor only says "readable": when its window is full, look again soon.
            wait = 10 if up and isinstance(remote, _SshChannel) else 1000
            for fd, events in poller.poll(wait):
                # The caller closed its end entirely (not a half-close): nobody reads any more.
                if fd == inner.fileno() and events & select.POLLHUP and not caller_open:
                    return
            poller.unregister(inner)
            poller.unregister(remote.fileno())
    finally:
        remote.close()
        inner.close()
