"""CloudKitty 25.0.0's own API (its WSGI app, ``tests/cloudkitty/ck_api.py``) on a free 127.0.0.1 port.

Shared by the tests that drive ratebeam through CloudKitty's API: it runs in CloudKitty's venv, in
``noauth`` mode, with storage v2 on InfluxDB (by default a port nothing listens on, for the tests
that read ratebeam's storage, not CloudKitty's), on the database of a ratebeam workspace: a SQLite
file, or a PostgreSQL URL (``cloudkitty_database``: CloudKitty's venv has no PostgreSQL driver, so
its psycopg2 comes from the overlay of ``tests/cloudkitty/setup_postgres_overlay.sh``).
``transport`` is CloudKitty's oslo.messaging URL: a real broker for the RPC tests, ``fake:/`` (the
in-process driver oslo.messaging ships) for endpoints that only touch the database.
Start-up: about 14 s until ``GET /`` answers (2 shared cores).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from . import REPO, cloudkitty_python, free_port, rc_dir, unavailable

CK_API = REPO / "tests" / "cloudkitty" / "ck_api.py"

CK_CONFIG = """\
[DEFAULT]
auth_strategy = noauth
transport_url = {transport}
api_paste_config = {paste}

[database]
connection = {database}

[storage]
version = 2
backend = influxdb

[storage_influxdb]
host = 127.0.0.1
port = {influx_port}
database = {influx_database}

[keystone_authtoken]
auth_type = none
endpoint = http://127.0.0.1:{unused}/
"""


def wait_for(what: str, check: Callable[[], bool], log: Path, process: subprocess.Popen | None = None,
             timeout: float = 120) -> None:
    """Poll ``check`` until true; fail with ``log``'s tail on timeout or when ``process`` exited."""
    deadline = time.monotonic() + timeout
    while not check():
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout} s (exited: {exited}): {log.read_text()[-3000:]}")
        time.sleep(0.3)


def cloudkitty_database(url: str) -> tuple[str, dict[str, str]]:
    """(URL, environment) for CloudKitty's venv to open ratebeam's database ``url``.

    PostgreSQL: psycopg2 (the driver CloudKitty's requirements leave to the deployer) from the
    overlay directory put first on ``PYTHONPATH``; the venv itself keeps its pins."""
    env = dict(os.environ)
    if not url.startswith("postgresql"):
        return url, env
    overlay = rc_dir() / "cloudkitty-pg-overlay"
    if not overlay.exists():
        unavailable(f"{overlay} missing (run tests/cloudkitty/setup_postgres_overlay.sh)")
    env["PYTHONPATH"] = str(overlay)
    return url.replace("postgresql+psycopg:", "postgresql+psycopg2:"), env


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


@contextmanager
def cloudkitty_api(database: Path | str, transport: str, scratch: Path,
                   influx: tuple[int, str] | None = None) -> Iterator[str]:
    """Serve CloudKitty's API on ``database`` (config and log in ``scratch``); yields its base URL.

    ``database``: a SQLite file, or ratebeam's SQLAlchemy URL of it (SQLite or PostgreSQL).

    ``influx``: (port, database) of the InfluxDB on 127.0.0.1 that its storage v2 reads (default:
    a port nothing listens on)."""
    conf = scratch / "cloudkitty.conf"
    url, env = cloudkitty_database(database if isinstance(database, str) else f"sqlite:///{database}")
    influx_port, influx_database = influx or (free_port(), "unused")
    conf.write_text(CK_CONFIG.format(transport=transport, paste=scratch / "api_paste.ini", database=url,
                                     influx_port=influx_port, influx_database=influx_database,
                                     unused=free_port()))
    port = free_port()
    log = scratch / "api.log"
    with log.open("w") as out:
        api = subprocess.Popen([cloudkitty_python(), CK_API, str(conf), str(port)], stdout=out,
                               stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("CloudKitty's API answering", lambda: _answers(base), log, api)
        yield base
    finally:
        api.terminate()
        api.wait(timeout=30)
