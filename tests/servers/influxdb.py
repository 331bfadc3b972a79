"""Private InfluxDB servers for the InfluxDB storage tests, on free 127.0.0.1 ports.

* ``influx_v1`` (session): Debian's ``influxd`` (1.6.7) — the InfluxQL ``/write`` + ``/query`` API.
* ``influx_v2`` (session): ``influxd`` 1.8.x built by ``tests/servers/influxdb_install.sh`` under
  ``$RC/influxdb18`` with ``flux-enabled`` — the ``/api/v2/write``, Flux ``/api/v2/query`` and
  ``/api/v2/delete`` endpoints (InfluxDB's 2.x compatibility layer, not InfluxDB 2.x itself).

Each server gets its own config, meta/data/wal dirs under a temporary directory and is stopped at
the end of the session.  A packaged service Debian may have started is never used.  A server that
is missing or does not answer ``/ping`` skips its tests with the reason (fails them under CI=true).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from . import free_port, installed, stop, unavailable

HOST = "127.0.0.1"


@dataclass(frozen=True)
class InfluxServer:
    """A running private server: its base URL and version line."""

    url: str
    version: str


def v1_binary() -> str | None:
    """Debian's influxd (``/usr/bin/influxd``), or any influxd on PATH."""
    return shutil.which("influxd") or (
        str(Path("/usr/bin/influxd")) if Path("/usr/bin/influxd").exists() else None
    )


def v2_binary() -> str | None:
    """The influxd 1.8.x that ``influxdb_install.sh`` builds (``$RC`` or ``~/.cache/ratebeam``)."""
    return installed("influxdb18/influxd")


def _config(root: Path, port: int, rpc_port: int, flux: bool, auth: bool = False) -> Path:
    text = f"""reporting-enabled = false
bind-address = "{HOST}:{rpc_port}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
[monitor]
  store-enabled = false
[http]
  bind-address = "{HOST}:{port}"
  log-enabled = false
  flux-enabled = {"true" if flux else "false"}
  auth-enabled = {"true" if auth else "false"}
[continuous_queries]
  enabled = false
"""
    path = root / "influxdb.conf"
    path.write_text(text)
    return path


class InfluxUnavailable(Exception):
    """The server could not be found or started; the message says why."""


class InfluxProcess:
    """A private server that a test can stop and start again (same port, same data): an outage."""

    def __init__(self, binary: str, config: Path, root: Path, url: str) -> None:
        self._binary, self._config, self.root, self.url = binary, config, root, url
        self._process: subprocess.Popen | None = None
        self.version = "?"

    def start(self) -> None:
        """Start the server (again) and wait until it answers ``/ping``."""
        with (self.root / "influxd.log").open("a") as log:
            self._process = subprocess.Popen([self._binary, "-config", str(self._config)], stdout=log,
                                             stderr=subprocess.STDOUT)
        self.version = _wait(self._process, self.url, self.root).version

    def stop(self) -> None:
        """Stop the server; its data stays for the next ``start``."""
        if self._process is not None:
            stop(self._process)
            self._process = None


@contextmanager
def stoppable(kind: str, auth: bool = False) -> Iterator[InfluxProcess]:
    """A started private ``kind`` server the block may stop and start again; removed at the end."""
    binary = v1_binary() if kind == "v1" else v2_binary()
    if binary is None:
        raise InfluxUnavailable(
            ("Debian's influxd is not installed" if kind == "v1" else "influxd 1.8.x (v2 API) is not built")
            + ": run tests/servers/influxdb_install.sh"
        )
    root = Path(tempfile.mkdtemp(prefix=f"ratebeam-influx-{kind}-"))
    port = free_port()
    config = _config(root, port, free_port(), flux=kind == "v2", auth=auth)
    server = InfluxProcess(binary, config, root, f"http://{HOST}:{port}")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def running(kind: str, auth: bool = False) -> Iterator[InfluxServer]:
    """A private ``kind`` ("v1" or "v2") server for the duration of the block (also used by bench/);
    ``auth``: authentication enabled (create the first admin user with ``CREATE USER``)."""
    with stoppable(kind, auth) as server:
        yield InfluxServer(server.url, server.version)


def _wait(process: subprocess.Popen, url: str, root: Path) -> InfluxServer:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            ping = requests.get(f"{url}/ping", timeout=1)
            if ping.status_code == 204:
                return InfluxServer(url, ping.headers.get("X-Influxdb-Version", "?"))
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    tail = (root / "influxd.log").read_text(errors="replace")[-1500:]
    raise InfluxUnavailable(f"influxd did not answer /ping on {url}: {tail}")


@pytest.fixture(scope="session")
def _influx_servers() -> Iterator[dict[str, InfluxServer | str]]:
    """Servers started lazily by kind (or the reason they are not there); all stopped at the end."""
    with ExitStack() as stack:
        started: dict[str, InfluxServer | str] = {}

        def start(kind: str) -> InfluxServer | str:
            if kind not in started:
                try:
                    started[kind] = stack.enter_context(running(kind))
                except InfluxUnavailable as exc:
                    started[kind] = str(exc)
            return started[kind]

        yield {"start": start}  # type: ignore[dict-item]


def _server(servers: dict, kind: str) -> InfluxServer:
    server = servers["start"](kind)
    if isinstance(server, str):
        unavailable(server)
    return server


@pytest.fixture(scope="session")
def influx_v1(_influx_servers) -> InfluxServer:
    """Debian's influxd 1.6.7 (v1 API) on a free port."""
    return _server(_influx_servers, "v1")


@pytest.fixture(scope="session")
def influx_v2(_influx_servers) -> InfluxServer:
    """influxd 1.8.x with Flux: the v2 API endpoints, on a free port."""
    server = _server(_influx_servers, "v2")
    health = requests.get(f"{server.url}/health", timeout=5)
    if health.status_code != 200:
        unavailable(f"{server.url}/health answered {health.status_code}: no v2 API")
    return server
