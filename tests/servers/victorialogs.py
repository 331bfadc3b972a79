"""A private VictoriaLogs server for the Loki storage tests, on a free 127.0.0.1 port.

VictoriaLogs v1.52.1 (Apache-2.0), built by ``tests/servers/victorialogs_install.sh`` under
``$RC/victorialogs``, serves Loki's push API at ``/insert/loki/api/v1/push``: the real receiver the
Loki writer is tested against (no real Loki can be had here: AGPL).  Its reads are not Loki's (no
LogQL, no ``query_range``, no delete), so tests check what was pushed with its own LogsQL API
(``/select/logsql/query``).  Tenants are numeric (``X-Scope-OrgID: <accountID>``); retention is
100 years, so 2024 test points are kept.  Missing: the tests skip with the reason (fail under CI=true).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from . import HttpServer, free_port, installed, stop, unavailable

HOST = "127.0.0.1"


class VictoriaLogs(HttpServer):
    """A running server: ``api`` is the Loki API base ratebeam is given."""

    api_path = "/insert/loki/api/v1"

    def query(self, logsql: str, tenant: str, expect: int = 0) -> list[dict]:
        """Every row ``logsql`` matches for ``tenant`` (fields as VictoriaLogs stores them), polling
        up to 15 s for at least ``expect`` rows: ingested rows become searchable about a second later."""
        deadline = time.monotonic() + 15
        while True:
            rows = self._query(logsql, tenant)
            if len(rows) >= expect or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)

    def _query(self, logsql: str, tenant: str) -> list[dict]:
        answer = requests.post(
            f"{self.url}/select/logsql/query",
            data={"query": logsql, "start": "1970-01-01T00:00:00Z"},
            headers={"AccountID": tenant},
            timeout=30,
        )
        answer.raise_for_status()
        return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


def binary() -> str | None:
    return installed("victorialogs/victoria-logs")


@pytest.fixture(scope="session")
def victorialogs() -> Iterator[VictoriaLogs]:
    """VictoriaLogs for the session (skipped with the reason when it is not built)."""
    program = binary()
    if program is None:
        unavailable("victoria-logs v1.52.1 is not built: run tests/servers/victorialogs_install.sh")
    root = Path(tempfile.mkdtemp(prefix="ratebeam-vlogs-"))
    url = f"http://{HOST}:{free_port()}"
    args = [program, f"-httpListenAddr={url[7:]}", f"-storageDataPath={root}/data", "-retentionPeriod=100y",
            "-loggerLevel=WARN"]
    with (root / "vlogs.log").open("w") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                unavailable(f"victoria-logs did not answer on {url}: {(root / 'vlogs.log').read_text()[-1000:]}")
            time.sleep(0.1)
        yield VictoriaLogs(url)
    finally:
        stop(process, root)
