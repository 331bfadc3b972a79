"""Prism, Beam's portable runner, as a job server on 127.0.0.1 for the portability tests.

``tests/servers/prism_install.sh`` builds it at ratebeam's ``PRISM_VERSION``.  ``prism_endpoint``
(session fixture) starts one job server on a free port and yields ``localhost:<port>`` for
``--runner=PortableRunner --job_endpoint=...``; ``running()`` does the same for a block (bench/ and
tests that need a private server, e.g. to kill it).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ratebeam.pipelines.runners.launch import PRISM_VERSION

from . import free_port, rc_dir, stop, unavailable

HOST = "127.0.0.1"


class PrismUnavailable(Exception):
    """Prism could not be found or started; the message says why."""


def prism_binary() -> str | None:
    """The binary built by ``prism_install.sh`` (``$RC/prism/v<beam>/prism``), or one on PATH."""
    built = rc_dir() / "prism" / f"v{PRISM_VERSION}" / "prism"
    return str(built) if built.exists() else shutil.which("prism")


@contextmanager
def running() -> Iterator[str]:
    """A Prism job server for the duration of the block; yields its ``localhost:<port>`` endpoint."""
    binary = prism_binary()
    if binary is None:
        raise PrismUnavailable("prism is not built: run tests/servers/prism_install.sh")
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="ratebeam-prism-"))
    with (log_dir / "prism.log").open("w") as log:
        process = subprocess.Popen(
            [binary, "--job_port", str(port), "--serve_http=false"], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection((HOST, port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            tail = (log_dir / "prism.log").read_text(errors="replace")[-1500:]
            raise PrismUnavailable(f"prism did not listen on {HOST}:{port}: {tail}")
        yield f"localhost:{port}"
    finally:
        stop(process, log_dir)


@pytest.fixture(scope="session")
def prism_endpoint() -> Iterator[str]:
    """One Prism job server for the test session: ``localhost:<port>``."""
    try:
        with running() as endpoint:
            yield endpoint
    except PrismUnavailable as exc:
        unavailable(str(exc))
