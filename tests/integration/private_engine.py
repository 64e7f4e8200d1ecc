"""A private Docker engine for tests that stop, restart or kill the engine (the shared one is never touched).

:class:`PrivateEngine` runs a second ``dockerd`` with its own data root, exec root (its containerd, which
dockerd 20.10 spawns itself, keeps its socket and state under ``<exec-root>/containerd``), pidfile, Unix
socket and cgroup parent, and no network changes on the host (``--bridge=none``, no iptables, no
masquerading, no forwarding). It registers the same runtimes as the system daemon (the ``runtimes`` of
``/etc/docker/daemon.json``, copied into its own ``--config-file``). Images travel without a registry:
``docker save IMAGE | docker -H PRIVATE load``.

A backend uses it through ``DOCKER_HOST=unix://<socket>`` (see :func:`daemon_socket_path`).

As a *remote* engine (issue 13): ``PrivateEngine(tls=True)`` also listens on TCP ``127.0.0.1:<free port>``
with TLS certificates made for this run with ``openssl`` (a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate), reached through :meth:`PrivateEngine.engine`; ``hide=DIR`` runs it
inside ``unshare --mount --propagation private`` with a tmpfs over ``DIR``, so it cannot see this
machine's copy of anything under it (a test workspace) — as an engine on another machine could not.
:meth:`PrivateEngine.load_image` copies an image by ``docker save | docker -H ... load``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import docker

from adk_sandbox.executor.backends.docker.engine import Engine

__all__ = ["DOCKERD", "PrivateEngine", "PrivateEngineError"]

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
SYSTEM_CONFIG = Path("/etc/docker/daemon.json")
#: How long the daemon may take to answer after it was started (about 3 s here).
START_SECONDS = 60.0
#: How long a SIGTERMed daemon may take to stop its containers and exit before it is SIGKILLed.
STOP_SECONDS = 30.0


class PrivateEngineError(RuntimeError):
    """The private engine could not be started (the reason and the tail of its log)."""


class PrivateEngine:
    """One private ``dockerd``; :meth:`start`, :meth:`stop`, :meth:`kill`, :meth:`destroy`.

    Every path is under one short directory in /tmp (a Unix socket path is limited to 108 bytes), which
    :meth:`destroy` removes after stopping the daemon and anything it left (containerd, shims, mounts).
    A subclass runs another dockerd the same way by overriding :meth:`_config` (its ``--config-file``) and
    :meth:`_launch_argv` (how the daemon is started: tests/integration/modern_engine.py).
    """

    #: The start of its directory's name in /tmp.
    prefix = "adk-pe-"

    def __init__(self, *, tls: bool = False, hide: Path | None = None, data_in_memory: bool = False) -> None:
        """``tls``: listen on TCP 127.0.0.1 with TLS too; ``hide``: a directory the engine sees empty.

        ``data_in_memory`` puts the data root on a tmpfs: a loaded image then goes in faster, and is gone
        at :meth:`destroy` with one unmount (deleting its files from disk takes 15 s here).
        """
        self.root = Path(tempfile.mkdtemp(prefix=self.prefix, dir="/tmp"))
        self.socket = str(self.root / "docker.sock")
        self.host = f"unix://{self.socket}"
        self.data_root = self.root / "data"
        self.exec_root = self.root / "exec"
        self.pidfile = self.root / "docker.pid"
        self.log_path = self.root / "dockerd.log"
        self.cgroup_parent = f"/adk-sandbox-private-{uuid.uuid4().hex[:8]}"
        self.config_file = self.root / "daemon.json"
        self.config_file.write_text(json.dumps(self._config()))
        self.process: subprocess.Popen[bytes] | None = None
        self.hide = hide
        if data_in_memory:
            self.data_root.mkdir()
            mount = ["mount", "-t", "tmpfs", "-o", "size=4g,mode=0710", "adk-pe-data", str(self.data_root)]
            subprocess.run(mount, check=True, capture_output=True)
        if hide is not None and (self.root == hide or hide in self.root.parents):
            raise PrivateEngineError(f"{hide} would hide the engine's own directory {self.root}")
        self.tls_dir: Path | None = None
        self.port: int | None = None
        if tls:
            self.tls_dir = self.root / "tls"
            _make_certificates(self.tls_dir)
            self.port = _free_port()

    @property
    def tcp_host(self) -> str:
        """``tcp://127.0.0.1:PORT`` (a TLS engine only)."""
        if self.port is None:
            raise PrivateEngineError("this private engine does not listen on TCP (made without tls=True)")
        return f"tcp://127.0.0.1:{self.port}"

    def engine(self, host: str | None = None) -> Engine:
        """The :class:`Engine` of the TCP+TLS endpoint (``host`` replaces its address, e.g. a proxy's)."""
        assert self.tls_dir is not None, "made without tls=True"
        return Engine(host=host or self.tcp_host, tls_verify=True, ca_cert=self.tls_dir / "ca.pem",
                      client_cert=self.tls_dir / "cert.pem", client_key=self.tls_dir / "key.pem")  # fmt: skip

    # -- the daemon ----------------------------------------------------------------------------------
    def _config(self) -> dict[str, object]:
        """The daemon's ``--config-file``: the system daemon's runtimes, nothing else of its configuration."""
        return _private_config()

    def _dockerd_argv(self, dockerd: str = DOCKERD) -> list[str]:
        """``dockerd`` and its options: every path of its own under :attr:`root`, no network changes."""
        argv = [
            dockerd,
            f"--config-file={self.config_file}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            f"--host={self.host}",
            f"--cgroup-parent={self.cgroup_parent}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            "--ip-forward=false",
            "--userland-proxy=false",
            "--live-restore=false",
        ]
        if self.tls_dir is not None:
            argv += [
                f"--host={self.tcp_host}",
                "--tlsverify",
                f"--tlscacert={self.tls_dir / 'ca.pem'}",
                f"--tlscert={self.tls_dir / 'server-cert.pem'}",
                f"--tlskey={self.tls_dir / 'server-key.pem'}",
            ]
        return argv

    def _launch_argv(self) -> list[str]:
        """The command that starts the daemon; its process must end up being dockerd (exec), which
        :meth:`stop` signals."""
        argv = self._dockerd_argv()
        if self.hide is not None:
            # Its own mount namespace, where a tmpfs covers the hidden directory; exec keeps dockerd's pid
            # the one this object stops.
            hide = 'mount -t tmpfs -o size=16m adk-pe-hide "$0" && exec "$@"'
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                hide,
                str(self.hide),
                *argv,
            ]
        return argv

    def start(self, timeout: float = START_SECONDS) -> None:
        """Start dockerd and wait until it answers a ping (:class:`PrivateEngineError` if it does not)."""
        if self.process is not None and self.process.poll() is None:
            raise PrivateEngineError("the private engine is already running")
        self._forget_dead_containerd()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._launch_argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise PrivateEngineError(
                    f"dockerd exited with status {self.process.returncode}{self._tail()}"
                )
            if self.answers():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise PrivateEngineError(f"dockerd did not answer within {timeout:g} s{self._tail()}")
            time.sleep(0.1)

    def _forget_dead_containerd(self) -> None:
        """Remove the pidfile of a containerd that died with a SIGKILLed dockerd.

        Until init reaps it, the dead containerd is a zombie, which dockerd takes for a live one: it would
        wait for it instead of starting its own, and give up ("timeout waiting for containerd to start").
        """
        pidfile = self.exec_root / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        if _is_dead(pid):
            pidfile.unlink(missing_ok=True)

    def answers(self) -> bool:
        """True when the daemon answers a ping on its socket."""
        if not os.path.exists(self.socket):
            return False
        try:
            client = docker.DockerClient(base_url=self.host, version="auto", timeout=5)
        except docker.errors.DockerException:
            return False
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def client(self) -> docker.DockerClient:
        """A docker-py client of the private engine (the caller closes it)."""
        client = docker.DockerClient(base_url=self.host, version="auto", timeout=60)
        client.api.trust_env = False
        return client

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM (dockerd stops its containers), wait, then SIGKILL; waits for the process to end."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def kill(self) -> None:
        """SIGKILL the daemon (its containerd dies with it; shims and containers stay, orphaned)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(10)

    def restart(self) -> None:
        """Stop (as a service manager would) and start again."""
        self.stop()
        self.start()

    def containers(self) -> list[str]:
        """Ids of every container on the private engine, running or not."""
        client = self.client()
        try:
            return [str(c["Id"]) for c in client.api.containers(all=True)]
        finally:
            client.close()

    # -- images --------------------------------------------------------------------------------------
    def load_image(self, image: str) -> float:
        """Copy ``image`` from the system engine by ``docker save | docker -H PRIVATE load``; the seconds."""
        started = time.monotonic()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        loaded = subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout,
                                capture_output=True, check=False)  # fmt: skip
        _, save_errors = save.communicate()
        if save.returncode != 0 or loaded.returncode != 0:
            raise PrivateEngineError(
                f"could not load {image} into the private engine: {save_errors.decode(errors='replace')} "
                f"{loaded.stderr.decode(errors='replace')}"
            )
        return time.monotonic() - started

    def import_minimal_image(self, source: str, tag: str) -> float:
        """Import into the private engine a small image cut out of ``source``; the seconds it took.

        ``docker save | docker load`` of the 296 MB base image takes 10-20 s here; what a session and these
        tests need (python3 and its standard library for the tests' own scripts, a shell, coreutils,
        ps, setsid and their libraries: about 40 MB) is tarred inside a throw-away container of ``source``
        and imported in a few seconds.
        """
        started = time.monotonic()
        cut = subprocess.Popen(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", source,
             "-c", _MINIMAL_ROOTFS],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        imported = subprocess.run(
            ["docker", "-H", self.host, "import", "-", tag],
            stdin=cut.stdout,
            capture_output=True,
            check=False,
        )
        _, cut_errors = cut.communicate()
        if cut.returncode != 0 or imported.returncode != 0:
            raise PrivateEngineError(
                f"could not import a minimal image of {source} into the private engine: "
                f"{cut_errors.decode(errors='replace')} {imported.stderr.decode(errors='replace')}"
            )
        return time.monotonic() - started

    # -- cleaning up ---------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Stop the daemon and remove everything it made: processes, mounts, cgroups, directories."""
        if self.answers():
            with contextlib.suppress(Exception):
                client = self.client()
                try:
                    for container in client.api.containers(all=True):
                        client.api.remove_container(container["Id"], force=True)
                finally:
                    client.close()
        self.stop()
        # What a killed daemon leaves: its containerd (normally killed with it), shims, container processes.
        deadline = time.monotonic() + 10
        while (left := self.leftover_processes()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for mount in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            _remove_cgroup(hierarchy / self.cgroup_parent.lstrip("/"))
        shutil.rmtree(self.root, ignore_errors=True)

    def leftover_processes(self) -> list[int]:
        """Pids of live processes of this engine: anything whose argv names its root, or in its cgroup."""
        root = str(self.root).encode()
        found = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmdline = handle.read()
                with open(f"/proc/{entry}/cgroup") as handle:
                    cgroups = handle.read()
            except OSError:
                continue
            if (root in cmdline or f":{self.cgroup_parent}/" in cgroups) and not _is_dead(int(entry)):
                found.add(int(entry))
        return sorted(found)

    def _mounts(self) -> list[str]:
        with open("/proc/self/mounts") as handle:
            points = [line.split()[1] for line in handle]
        prefix = str(self.root) + "/"
        return [point for point in points if point.startswith(prefix)]

    def _tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "; dockerd's log ends:\n" + "\n".join(text.splitlines()[-15:])


# Run inside the source image: a tar (on stdout) of the programs below, their libraries, python3's standard
# library (without its tests, IDE and caches) and the few directories a session mounts over.
_MINIMAL_ROOTFS = r"""set -e
files=""
for tool in python3 sh dash bash sleep setsid kill ps cat mktemp chmod rm echo env nohup true false id \
            head tail ls mkdir rmdir stat touch printf grep sed wc; do
  path=$(command -v "$tool") || continue
  case $path in /*) ;; *) path=/usr/bin/$tool; [ -e "$path" ] || continue ;; esac  # a shell builtin
  files="$files $path"
done
python=$(readlink -f "$(command -v python3)")
stdlib=/usr/lib/$(basename "$python")
libs=$(for f in $files "$stdlib"/lib-dynload/*.so; do
  ldd "$f" 2>/dev/null | awk '/=>/ {print $3} /ld-linux/ {print $1}'
done)
# Each path once (a path named twice goes into the tar as a hard link to itself, which import refuses), by
# its real directory (/lib links to usr/lib: a file named under /lib would make tar store a directory "lib"
# where the image has the link), and the file its last symlink points to.
{
  printf '%s\n' /bin /sbin /lib /lib64 /etc/passwd /etc/group /tmp /home "$stdlib"
  for path in $files $libs; do
    echo "$(readlink -f "$(dirname "$path")")/$(basename "$path")"
    readlink -f "$path"
  done
} | sort -u | tar -c --exclude="$stdlib/test" --exclude="$stdlib/idlelib" --exclude="$stdlib/tkinter" \
    --exclude="$stdlib/ensurepip" --exclude="$stdlib/pydoc_data" --exclude="$stdlib/config-*" \
    --exclude=__pycache__ --exclude="$stdlib/site-packages" -T - 2>/dev/null
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, made with openssl.

    The names are the Docker CLI's (``DOCKER_CERT_PATH``: ca.pem, cert.pem, key.pem), plus the server's.
    """
    directory.mkdir(mode=0o700)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    days = "2"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem",
            "-days", days, "-subj", "/CN=adk-sandbox test CA")  # fmt: skip
    for name, subject, extensions in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "/CN=adk-sandbox test client", "extendedKeyUsage=clientAuth"),
    ):
        key, cert = ("server-key.pem", "server-cert.pem") if name == "server" else ("key.pem", "cert.pem")
        (directory / f"{name}.ext").write_text(extensions + "\n")
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", f"{name}.csr", "-subj", subject
        )
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", cert, "-days", days, "-extfile", f"{name}.ext")  # fmt: skip


def _private_config() -> dict[str, object]:
    """The system daemon's runtimes (gVisor and the like), nothing else of its configuration."""
    try:
        system = json.loads(SYSTEM_CONFIG.read_text())
    except (OSError, ValueError):
        return {}
    runtimes = system.get("runtimes") if isinstance(system, dict) else None
    return {"runtimes": runtimes} if isinstance(runtimes, dict) else {}


def _is_dead(pid: int) -> bool:
    """True when no process ``pid`` runs (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _remove_cgroup(path: Path) -> None:
    """Remove a (normally empty) cgroup directory tree, children first."""
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            _remove_cgroup(child)
    with contextlib.suppress(OSError):
        path.rmdir()


# -- an ssh path to the engine ------------------------------------------------------------------------------
#: Where scripts/setup unpacks Debian's openssh-server (not installed: no service, no port 22).
SSHD_ROOT = Path(os.environ.get("ADK_SANDBOX_SSHD_ROOT", Path.home() / ".cache" / "adk-sandbox" / "openssh"))


def find_sshd() -> Path | None:
    """The sshd binary: the system's, else the one scripts/setup unpacked."""
    for candidate in (Path("/usr/sbin/sshd"), SSHD_ROOT / "usr" / "sbin" / "sshd"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


class PrivateSshd:
    """Debian's sshd on 127.0.0.1:<free port> as its own process, forwarding to one engine's Unix socket.

    Its one authorised key may only run ``docker system dial-stdio`` against ``docker_host`` (a forced
    command), which is what docker-py's paramiko mode and the engine bridge ask for. :attr:`home` holds the
    client's key and ``known_hosts``: a test points ``HOME`` at it. Stopped by pid.
    """

    def __init__(self, sshd: Path, directory: Path, docker_host: str, *, max_sessions: int = 10) -> None:
        """``max_sessions``: sshd's ``MaxSessions``, the channels one connection may hold (its default 10)."""
        self.sshd = sshd
        self.directory = directory
        self.home = directory / "home"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        for key in (directory / "host_key", ssh / "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        host_key = (directory / "host_key.pub").read_text().split()
        (ssh / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        forced = f'command="DOCKER_HOST={docker_host} exec docker system dial-stdio",restrict'
        (directory / "authorized_keys").write_text(f"{forced} {(ssh / 'id_ed25519.pub').read_text()}")
        (directory / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {directory / 'host_key'}\n"
            f"AuthorizedKeysFile {directory / 'authorized_keys'}\nPidFile {directory / 'sshd.pid'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding no\nX11Forwarding no\n"
            f"MaxSessions {max_sessions}\n"
        )

    @property
    def host(self) -> str:
        """``ssh://root@127.0.0.1:PORT``."""
        return f"ssh://root@127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        """Start sshd (in the foreground of its own process) and wait until its port answers."""
        # sshd refuses to start without its privilege separation directory (made by the package's scripts,
        # which did not run: the package is unpacked, not installed).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        library = self.sshd.parent.parent / "lib" / "x86_64-linux-gnu"
        env = {**os.environ, "LD_LIBRARY_PATH": str(library)} if library.is_dir() else None
        log = open(self.directory / "sshd.log", "ab")  # noqa: SIM115 - the process's own log, kept open by it
        self.process = subprocess.Popen(
            [str(self.sshd), "-D", "-e", "-f", str(self.directory / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                text = (self.directory / "sshd.log").read_text(errors="replace")
                raise PrivateEngineError(f"sshd exited with status {self.process.returncode}: {text[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise PrivateEngineError(f"sshd did not listen within {timeout:g} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM sshd (by its pid) and wait; its connections' processes end with their connections."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
