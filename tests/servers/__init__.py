"""Real servers for the integration tests, started on 127.0.0.1 by session fixtures.

A server that cannot be started makes its tests skip with the reason, except under ``CI=true``
where it makes them fail (a green CI must mean the servers were really there).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[2]


def rc_dir() -> Path:
    """Where test servers keep their files: ``$RATEBEAM_RC`` or ``<repo>/.rc``."""
    return Path(os.environ.get("RATEBEAM_RC") or REPO / ".rc")


def installed(relative: str) -> str | None:
    """``relative`` under the directory ``rc.sh`` installs into (``$RC`` or ``~/.cache/ratebeam``), if there."""
    for root in (rc_dir(), Path.home() / ".cache" / "ratebeam"):
        if (root / relative).exists():
            return str(root / relative)
    return None


def unavailable(reason: str) -> None:
    """Skip the test (fail it when ``CI=true``) because a server it needs is not there."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and a required server is unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def cloudkitty_python() -> Path:
    """The Python of CloudKitty's virtualenv under ``$RC`` (``tests/cloudkitty/setup_venv.sh``)."""
    python = rc_dir() / "cloudkitty-venv" / "bin" / "python"
    if not python.exists():
        unavailable(f"CloudKitty venv missing: {python} (run tests/cloudkitty/setup_venv.sh)")
    return python


def free_port() -> int:
    """A TCP port nothing listens on right now (also used for the 'server is down' tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen, scratch: Path | None = None, grace: float = 15) -> None:
    """Stop a server: terminate, kill if it has not exited after ``grace`` s; then remove its ``scratch`` dir."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class HttpServer:
    """A running server: ``url`` is its root, ``api`` the base URL ratebeam's options are given."""

    url: str
    #: Where the API ratebeam speaks lives below ``url``.
    api_path: ClassVar[str] = ""

    @property
    def api(self) -> str:
        """``url`` + ``api_path``."""
        return self.url + self.api_path
