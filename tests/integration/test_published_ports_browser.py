"""A real browser on the host loads a page from a dev server the agent started, through a published port.

The sandbox (runc, the default hardened profile, network ``none``) runs ``python3 -m http.server`` on its
own ``127.0.0.1`` as a background command, serving an ``index.html`` with a token in its markup and a
script that writes a second token into the page; the second token is not in the file, so finding it in
the DOM headless Chromium dumps shows the browser fetched the page through ``session.publish(port)`` and
ran its JavaScript. After the session's close the address refuses, and the browser's load fails.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from adk_sandbox.executor import ExecRequest, Language
from adk_sandbox.executor.backends.docker import DockerBackend
from tests.conftest import require

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_backend")]

#: Writes the page, then serves its directory on the sandbox's loopback (kept running: background).
DEV_SERVER = """
mkdir -p /tmp/site
printf '%s' "$PAGE" > /tmp/site/index.html
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory /tmp/site >/tmp/site.log 2>&1 &
"""


def chromium() -> str:
    """Debian's ``chromium`` (``scripts/setup`` installs it), or another distribution's name for it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    require(found is not None, "chromium is not installed: run scripts/setup (as root on Debian)")
    assert found is not None
    return found


def dump_dom(browser: str, url: str, profile: Path) -> subprocess.CompletedProcess[str]:
    """Headless Chromium's DOM of ``url`` after its scripts ran (root needs ``--no-sandbox``); bounded."""
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            # No calls home: this machine's network is closed, and the test is about one address only.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_for_http(address: str, seconds: float = 20) -> None:
    """Until a GET through ``address`` is answered (the server inside may still be starting)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=5) as client:
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            client.settimeout(5)
            if client.recv(100).startswith(b"HTTP/1.0 200"):
                return
        time.sleep(0.1)
    pytest.fail(f"the dev server never answered through {address}")


def test_a_browser_loads_a_sandboxs_dev_server_through_a_published_port(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    browser = chromium()
    markup_token = f"served-{secrets.token_hex(8)}"
    script_token = f"scripted-{secrets.token_hex(8)}"
    # The script builds its token reversed, so only a browser that ran it has the token in its DOM.
    page = (
        f"<!doctype html><html><head><title>dev</title></head><body><p>{markup_token}</p>"
        f'<script>const p = document.createElement("p"); p.id = "js";'
        f'p.textContent = "{script_token[::-1]}".split("").reverse().join("");'
        "document.body.appendChild(p);</script></body></html>"
    )
    assert script_token not in page
    port = random.randint(20000, 29999)

    session = docker_backend.session()
    try:
        started = session.execute(
            ExecRequest(
                language=Language.COMMAND,
                code=DEV_SERVER,
                env={"PAGE": page, "PORT": str(port)},
                background=True,
                timeout=30,
            )
        )
        assert started.exit_code == 0, started.stderr
        inspect = docker_backend._client.api.inspect_container(session.container_id)
        assert inspect["HostConfig"]["NetworkMode"] == "none" and inspect["HostConfig"]["CapDrop"] == ["ALL"]
        address = session.publish(port)
        assert address.startswith("127.0.0.1:")
        wait_for_http(address)

        loaded = dump_dom(browser, f"http://{address}/", tmp_path / "profile")
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        assert markup_token in loaded.stdout, (loaded.stdout[-2000:], loaded.stderr[-2000:])
        assert f'<p id="js">{script_token}</p>' in loaded.stdout, loaded.stdout[-2000:]
    finally:
        session.close()

    host, _, number = address.rpartition(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(number)), timeout=2).close()
    refused = dump_dom(browser, f"http://{address}/", tmp_path / "profile-after")
    assert markup_token not in refused.stdout and script_token not in refused.stdout
    assert "ERR_CONNECTION_REFUSED" in refused.stderr, refused.stderr[-2000:]
