"""A private RabbitMQ broker for CloudKitty's RPC tests, on a free 127.0.0.1 port.

Debian's ``rabbitmq-server`` (3.10, installed by ``tests/servers/install.sh``) run as the test
user straight from ``/usr/lib/rabbitmq/bin`` (the ``/usr/sbin`` wrapper switches to the
``rabbitmq`` user), with its own node name, mnesia, log, cookie (``HOME``) and plugin file under a
scratch directory, no plugin, and the Erlang distribution port next to the AMQP one.  The default
``guest`` user may connect from 127.0.0.1.  Erlang's port mapper (``epmd``, about 2 MB) is started
by the first node of the host and stays, as on any Erlang host.

Start-up cost (2 shared cores, measured 2026-12-02): 8-18 s until AMQP answers, about 125 MB
resident.  Missing server: the tests skip with the reason (fail under CI=true).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from . import free_port, stop, unavailable

HOST = "127.0.0.1"
SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def running() -> Iterator[str]:
    """A broker for the duration of the block (``bench/`` too); yields ``rabbit://guest:guest@127.0.0.1:<port>/``."""
    if not SERVER.exists():
        unavailable(f"rabbitmq-server is not installed ({SERVER}): run tests/servers/install.sh")
    root = Path(tempfile.mkdtemp(prefix="ratebeam-rabbitmq-"))
    port = free_port()
    (root / "enabled_plugins").write_text("[].\n")
    env = {
        **os.environ, "HOME": str(root), "RABBITMQ_NODENAME": f"ratebeam{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST, "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": str(root / "mnesia"), "RABBITMQ_LOG_BASE": str(root / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"), "RABBITMQ_PID_FILE": str(root / "pid"),
        "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq"), "ERL_EPMD_ADDRESS": HOST,
    }
    with (root / "server.log").open("w") as log:
        process = subprocess.Popen([str(SERVER)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _answers(port):
            if time.monotonic() > deadline or process.poll() is not None:
                unavailable(f"rabbitmq-server did not answer on {HOST}:{port}: "
                            f"{(root / 'server.log').read_text()[-1500:]}")
            time.sleep(0.2)
        yield f"rabbit://guest:guest@{HOST}:{port}/"
    finally:
        stop(process, root)


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """``rabbit://guest:guest@127.0.0.1:<port>/`` of a broker for the session."""
    with running() as url:
        yield url
