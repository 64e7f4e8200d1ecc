"""The in-sandbox proxy endpoint of a host process under a network policy (bubblewrap): a byte forwarder.

Run inside the sandbox by the system's own Python, isolated (``python3 -I -S inside_forward.py SOCKET
PROGRAM [ARG...]``), so it imports nothing but the standard library and nothing of this package. The
sandbox has no network but its own loopback (``--unshare-net``); this program:

1. listens on ``127.0.0.1``, a port the kernel picks;
2. starts ``PROGRAM`` as its child, with ``HTTP_PROXY``, ``HTTPS_PROXY``, ``http_proxy`` and ``https_proxy``
   naming that port and ``NO_PROXY``/``no_proxy`` = ``localhost,127.0.0.1``; stdin, stdout and stderr
   pass to the child untouched (inherited), and so does every other variable;
3. carries each accepted connection, as bytes it never reads the meaning of, to a fresh connection to the
   Unix socket ``SOCKET``, where the host's relay decides, resolves, checks and connects
   (``executor/network/unix_endpoint.py``); at most :data:`MAX_CONNECTIONS` at once, one more is closed
   at once;
4. waits for the child and exits with its status (a child killed by signal ``n``: ``128 + n``, as a shell
   reports it).

Nothing here is trusted: the command can connect to ``SOCKET`` itself, flood this listener, or kill this
process (then its sandbox ends with it). The host side is the only judge of what a connection may reach.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time

__all__ = ["MAX_CONNECTIONS", "main", "proxy_environment"]

#: The most connections carried at once; one more is accepted and closed at once.
MAX_CONNECTIONS = 256
#: Bytes read at once per direction.
_CHUNK = 64 * 1024
_SPLICE_CHUNK = 1 << 20  # the most bytes asked of one splice
_SPLICE_PIPE = 256 << 10  # the pipe's size: the most bytes moved per call and held, per direction
#: Stack of a carrying thread: it only copies bytes.
_STACK_SIZE = 256 * 1024
#: Exit statuses as a shell gives them: a program that cannot be run, one that was not found.
_CANNOT_RUN = 126
_NOT_FOUND = 127
_SIGNALLED = 128


def proxy_environment(port: int) -> dict[str, str]:
    """The variables the child gets on top of its environment: the proxy on ``port`` and its exceptions."""
    url = f"http://127.0.0.1:{port}"
    local = "localhost,127.0.0.1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": local,
        "no_proxy": local,
    }


def _splice(source: socket.socket, target: socket.socket) -> None:
    """Copy in the kernel through a pipe (Python 3.10+ on Linux): the bytes never enter this process."""
    read_end, write_end = os.pipe()
    # The default pipe (64 KiB) would move a quarter as much per pair of calls (as in the host's relay).
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _SPLICE_PIPE)
    try:
        while True:
            moved = os.splice(source.fileno(), write_end, _SPLICE_CHUNK)
            if not moved:
                return
            while moved:
                moved -= os.splice(read_end, target.fileno(), moved)
    finally:
        os.close(read_end)
        os.close(write_end)


def _copy(source: socket.socket, target: socket.socket) -> None:
    """Copy ``source`` to ``target`` until ``source`` ends, then end ``target``'s sending side."""
    try:
        if hasattr(os, "splice"):
            _splice(source, target)
        else:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def _carry(client: socket.socket, path: str, slots: threading.BoundedSemaphore) -> None:
    """Carry one accepted connection to a fresh connection to the host's socket at ``path``."""
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            host.connect(path)
        except OSError:
            return  # the host side is gone (or refused): the client sees its connection closed
        down = threading.Thread(target=_copy, args=(host, client), daemon=True)
        down.start()
        _copy(client, host)
        down.join()
    finally:
        for end in (host, client):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()
        slots.release()


def _accept(listener: socket.socket, path: str) -> None:
    """Accept connections for ever, each carried in a thread of its own, at most MAX_CONNECTIONS at once."""
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            time.sleep(0.05)  # e.g. out of descriptors for a moment: the listener stays
            continue
        if not slots.acquire(blocking=False):
            client.close()  # over the bound: refused by closing
            continue
        try:
            threading.Thread(target=_carry, args=(client, path, slots), daemon=True).start()
        except RuntimeError:  # no thread to be had: refused like one over the bound
            client.close()
            slots.release()


def _exit_status(returncode: int) -> int:
    return _SIGNALLED - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    """Serve the proxy endpoint, run the command as a child, and return its exit status."""
    if len(argv) < 2:
        sys.stderr.write("usage: inside_forward.py SOCKET PROGRAM [ARG...]\n")
        return 2
    path, command = argv[0], argv[1:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    threading.stack_size(_STACK_SIZE)
    threading.Thread(target=_accept, args=(listener, path), daemon=True).start()
    env = dict(os.environ)
    env.update(proxy_environment(port))
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError as error:
        sys.stderr.write(f"adk-sandbox: {command[0]}: {error.strerror}\n")
        return _NOT_FOUND
    except OSError as error:
        sys.stderr.write(f"adk-sandbox: {command[0]}: {error.strerror}\n")
        return _CANNOT_RUN
    while True:
        try:
            return _exit_status(child.wait())
        except KeyboardInterrupt:  # a SIGINT for the child too (same session): wait for it to end
            continue


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(status)  # at once: the carrying threads end with the sandbox
