"""The in-sandbox proxy endpoint of a host process under a network policy (bubblewrap): a byte forwarder.

Run by the system's Python, isolated (``python3 -I -S inside_forward.py SOCKET PROGRAM [ARG...]``), so
it imports only the standard library: it listens on ``127.0.0.1``, starts ``PROGRAM`` with the proxy
variables (:func:`proxy_environment`), passes each accepted socket to the host over ``SOCKET`` and exits
with the program's status. See docs/network.md, section "Host processes under bubblewrap".
"""

from __future__ import annotations

import array
import os
import socket
import subprocess
import sys
import threading
import time

__all__ = ["main", "proxy_environment"]

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


def _pass(client: socket.socket, path: str) -> None:
    """Hand one accepted connection to the host: one byte carrying the client's socket (``SCM_RIGHTS``).

    The host serves the socket itself (no copy here); both of this process's descriptors are closed at once.
    A host socket that is gone or full (a non-blocking connect fails) leaves the client's connection closed.
    """
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        host.setblocking(False)
        host.connect(path)
        host.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [client.fileno()]))])
    except OSError:
        pass
    finally:
        host.close()
        client.close()


def _accept(listener: socket.socket, path: str) -> None:
    """Accept connections for ever, each passed to the host at once (the host bounds how many it serves)."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            time.sleep(0.05)  # e.g. out of descriptors for a moment: the listener stays
            continue
        _pass(client, path)


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
