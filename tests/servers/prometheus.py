"""A private Prometheus for the tests: Debian's 2.42, backfilled with deterministic history, on 127.0.0.1.

``prometheus_server`` (session fixture) generates ``SERIES`` — four hours of one-minute samples from
2026-01-01T00:00Z, each at second 30 of its minute so no sample sits on a period boundary (2.42's
ranges include both ends) — writes them as OpenMetrics, backfills a fresh data directory with
``promtool tsdb create-blocks-from openmetrics``, starts ``prometheus`` on a free port with a 100-year
retention (the default 15 d would delete the backfilled blocks), waits for ``/-/ready`` and stops it
at the end of the session.  Tests compute their expectations from ``SERIES`` by hand.
``prometheus_secure_server`` is a second, empty server behind its own TLS certificate (made with
``openssl``) and basic auth (``--web.config.file``), for the client's TLS and auth options.

Missing binaries (``tests/servers/prometheus_install.sh`` installs them) skip the tests with the
reason, or fail them under ``CI=true``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from . import HttpServer, free_port, stop, unavailable

START = datetime(2026, 1, 1, tzinfo=UTC)
HOURS = 4
STEP = 60
OFFSET = 30  # samples at second 30 of each minute
SAMPLES = HOURS * 3600 // STEP

HOSTILE = 'p1"} or vector(1) or {x="'  # tries to close the matcher and OR in every series
WEIRD = 'a\\b{c}"d'  # backslash, braces, quote
NEWLINE = "line\nbreak"
SCOPES = ("p1", "p2", HOSTILE, WEIRD, NEWLINE)

#: The fetcher's metric: one series per scope with its domain, sampled every minute from 10 minutes
#: before the server starts to 3 hours after, so an instant query "now" (no time, as CloudKitty's
#: fetcher sends) finds it during the whole test session; and over the history (``START`` to 8 hours
#: after), so a run with ``--now`` in the history (the fetcher queries at the cycle's now) finds it.
PROJECT_INFO = "ratebeam_project_info"
DOMAINS = {"p1": "default", "p2": "other", HOSTILE: "default", WEIRD: "default", NEWLINE: "other"}

VOLUME_BY_HOUR = (123456789.55, 123456788.5, 12345678901.0, 0.1234567891)  # 9-digit rounding cases
GIB = 1073741824


@dataclass(frozen=True)
class Series:
    """One generated series: its metric family, type, labels and one value per sample (k = 0..SAMPLES-1)."""

    metric: str
    kind: str  # gauge or counter
    labels: dict[str, str] = field(hash=False)
    values: tuple[float | None, ...] = ()  # None: no sample at that minute (the series is absent)

    def at(self, k: int) -> datetime:
        return START + timedelta(seconds=OFFSET + STEP * k)

    def window(self, end: datetime, seconds: int) -> list[float]:
        """The sample values a ``[<seconds>s]`` range at ``end`` selects (both ends included, as 2.42)."""
        begin = end - timedelta(seconds=seconds)
        return [v for k, v in enumerate(self.values) if begin <= self.at(k) <= end and v is not None]


def _series() -> tuple[Series, ...]:
    hour = [k // 60 for k in range(SAMPLES)]
    minute = [k % 60 for k in range(SAMPLES)]
    out = [
        Series("ratebeam_instance_up", "gauge",
               {"project_id": "p1", "id": "i1", "flavor_name": "m1.small", "os_distro": "linux"},
               tuple(1.0 for _ in range(SAMPLES))),
        Series("ratebeam_instance_up", "gauge",
               {"project_id": "p1", "id": "i2", "flavor_name": "m1.large", "os_distro": "windows"},
               tuple(1.0 if h < 2 else 0.0 for h in hour)),
        Series("ratebeam_instance_up", "gauge",  # no os_distro label at all
               {"project_id": "p2", "id": "i3", "flavor_name": "m1.small"},
               tuple(1.0 for _ in range(SAMPLES))),
        Series("ratebeam_instance_up", "gauge",
               {"project_id": HOSTILE, "id": "i4", "flavor_name": "m1.tiny", "os_distro": "linux"},
               tuple(1.0 for _ in range(SAMPLES))),
        Series("ratebeam_instance_up", "gauge",
               {"project_id": WEIRD, "id": "i5", "flavor_name": "m1.small", "os_distro": "linux"},
               tuple(1.0 for _ in range(SAMPLES))),
        Series("ratebeam_instance_up", "gauge",
               {"project_id": NEWLINE, "id": "i6", "flavor_name": "m1.large", "os_distro": "linux"},
               tuple(1.0 if h % 2 == 0 else 0.0 for h in hour)),
        Series("ratebeam_volume_bytes", "gauge", {"project_id": "p1", "id": "v1", "volume_type": "ssd"},
               tuple(VOLUME_BY_HOUR[h] for h in hour)),
        Series("ratebeam_volume_bytes", "gauge", {"project_id": "p2", "id": "v2", "volume_type": "hdd"},
               tuple(float(GIB * (1 + m)) for m in minute)),
        Series("ratebeam_load", "gauge", {"project_id": "p1", "host": "h1"}, tuple(2.5 for _ in range(SAMPLES))),
        Series("ratebeam_load", "gauge", {"project_id": "p2", "host": "h2"}, tuple(-6.25 for _ in range(SAMPLES))),
        Series("ratebeam_net_bytes", "counter", {"project_id": "p1", "interface": "eth0"},
               tuple(1000.0 + 60 * k for k in range(SAMPLES))),
        Series("ratebeam_net_bytes", "counter", {"project_id": "p2", "interface": "eth0"},
               tuple(5000.0 + 120 * k for k in range(SAMPLES))),
    ]
    return tuple(out)


SERIES = _series()


def series(metric: str, **labels: str) -> list[Series]:
    """The generated series of ``metric`` whose labels include ``labels``."""
    return [s for s in SERIES if s.metric == metric and all(s.labels.get(k) == v for k, v in labels.items())]


def _om_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(now: float, series: tuple[Series, ...] = SERIES) -> str:
    """``series`` and the live ``PROJECT_INFO`` around ``now`` as an OpenMetrics document (families
    contiguous, samples in time order, ``# EOF``)."""
    lines: list[str] = [f"# TYPE {PROJECT_INFO} gauge"]
    first = int(now) // 60 * 60 - 600
    for scope, domain in DOMAINS.items():
        labels = f'project_id="{_om_value(scope)}",domain="{domain}"'
        history = int(START.timestamp())
        lines += [f"{PROJECT_INFO}{{{labels}}} 1 {history + 60 * k}" for k in range(8 * 60)]
        lines += [f"{PROJECT_INFO}{{{labels}}} 1 {first + 60 * k}" for k in range(190)]
    for family in dict.fromkeys(s.metric for s in series):
        members = [s for s in series if s.metric == family]
        lines.append(f"# TYPE {family} {members[0].kind}")
        name = family + ("_total" if members[0].kind == "counter" else "")
        for s in members:
            labels = ",".join(f'{k}="{_om_value(v)}"' for k, v in s.labels.items())
            lines += [f"{name}{{{labels}}} {value!r} {int(s.at(k).timestamp())}"
                      for k, value in enumerate(s.values) if value is not None]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


class PrometheusServer(HttpServer):
    """A running test server; ``api`` is the URL ratebeam's options take (with ``/api/v1``)."""

    api_path = "/api/v1"

    def queries_answered(self) -> int:
        """Instant queries (``/api/v1/query``) the server has answered so far, any status: its own count."""
        text = requests.get(f"{self.url}/metrics", timeout=30).text
        return int(sum(float(v) for v in _QUERY_REQUESTS.findall(text)))


_QUERY_REQUESTS = re.compile(r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\} (\S+)$', re.M)


def _binaries() -> tuple[str, str]:
    found = [shutil.which(b) or (f"/usr/bin/{b}" if Path(f"/usr/bin/{b}").exists() else None)
             for b in ("prometheus", "promtool")]
    if None in found:
        unavailable("Prometheus not installed (no prometheus/promtool): run tests/servers/prometheus_install.sh")
    return found[0], found[1]  # type: ignore[return-value]


def _ready(url: str, cafile: str | None, auth: tuple[str, str] | None) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=1, verify=cafile or True, auth=auth).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def _running(prometheus: str, root: Path, scheme: str = "http", web_config: str | None = None,
             cafile: str | None = None, auth: tuple[str, str] | None = None,
             flags: tuple[str, ...] = (), config: str | None = None) -> Iterator[PrometheusServer]:
    """``prometheus`` over ``root/tsdb`` on a free port (with extra command-line ``flags``) until the block exits."""
    (root / "prometheus.yml").write_text(config or "global:\n  scrape_interval: 1h\nscrape_configs: []\n",
                                         encoding="utf-8")
    port = free_port()
    url = f"{scheme}://127.0.0.1:{port}"
    command = [prometheus, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
               "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{port}"]
    if web_config is not None:
        (root / "web.yml").write_text(web_config, encoding="utf-8")
        command.append(f"--web.config.file={root / 'web.yml'}")
    command += flags
    with (root / "prometheus.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not _ready(url, cafile, auth):
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "prometheus.log").read_text()[-2000:]
                    unavailable(f"Prometheus did not start on {url}: {tail}")
                time.sleep(0.1)
            yield PrometheusServer(url)
        finally:
            stop(process)


@contextmanager
def backfilled(root: Path, series: tuple[Series, ...] = SERIES, flags: tuple[str, ...] = ()) -> Iterator[PrometheusServer]:
    """A Prometheus over ``series`` (and the live ``PROJECT_INFO``) backfilled in ``root``, until the block exits.

    ``flags`` are extra command-line flags (e.g. ``--query.max-samples=250``)."""
    prometheus, promtool = _binaries()
    (root / "data.om").write_text(openmetrics(time.time(), series), encoding="utf-8")
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(root / "data.om"),
                           str(root / "tsdb")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"promtool backfill failed: {done.stderr or done.stdout}", pytrace=False)
    with _running(prometheus, root, flags=flags) as server:
        yield server


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A private Prometheus over the backfilled ``SERIES``, for the whole test session."""
    with backfilled(tmp_path_factory.mktemp("prometheus")) as server:
        yield server


#: The TLS + basic-auth server's user; the hash is bcrypt (cost 4, fast) of ``SECURE_PASSWORD``.
SECURE_USER = "alice"
SECURE_PASSWORD = "s3cret"
_SECURE_HASH = "$2b$04$08fM/9GY9p/sJf5jnHJaHemeK4pnec1UHpxQtG.zQf2Qf/ooR4XOC"


@dataclass(frozen=True)
class SecureServer:
    """A Prometheus serving HTTPS with a self-signed certificate (``cafile``) and basic auth."""

    server: PrometheusServer
    cafile: str


@pytest.fixture(scope="session")
def prometheus_secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    """An empty Prometheus behind its own TLS (certificate for 127.0.0.1 made with openssl) and basic auth."""
    prometheus, _ = _binaries()
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl not installed: cannot make the test server's certificate")
    root = tmp_path_factory.mktemp("prometheus-tls")
    done = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"openssl failed: {done.stderr}", pytrace=False)
    web = (f"tls_server_config:\n  cert_file: {root / 'cert.pem'}\n  key_file: {root / 'key.pem'}\n"
           f"basic_auth_users:\n  {SECURE_USER}: '{_SECURE_HASH}'\n")
    cafile = str(root / "cert.pem")
    with _running(prometheus, root, "https", web, cafile, (SECURE_USER, SECURE_PASSWORD)) as server:
        yield SecureServer(server, cafile)


@contextmanager
def scraping(root: Path, targets: dict[str, str]) -> Iterator[PrometheusServer]:
    """An empty Prometheus scraping each ``job → host:port`` of ``targets`` every second, until the block exits."""
    prometheus, _ = _binaries()
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
                   for job, target in targets.items())
    config = f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{jobs}"
    root.mkdir(parents=True, exist_ok=True)
    with _running(prometheus, root, config=config) as server:
        yield server


def instant(server: PrometheusServer, query: str) -> dict[str, float]:
    """The answer of an instant PromQL query: each series' labels (as sorted JSON) → value."""
    import json

    answer = requests.get(f"{server.api}/query", params={"query": query}, timeout=30).json()
    assert answer["status"] == "success", answer
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in answer["data"]["result"]}


@contextmanager
def pushgateway(root: Path) -> Iterator[HttpServer]:
    """Debian's Prometheus Pushgateway on a free 127.0.0.1 port, until the block exits."""
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        unavailable("prometheus-pushgateway not installed: run tests/servers/prometheus_install.sh")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (root / "pushgateway.log").open("w") as log:
        process = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                                   stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not _ready(url, None, None):
                if process.poll() is not None or time.monotonic() > deadline:
                    unavailable(f"the Pushgateway did not start on {url}: {(root / 'pushgateway.log').read_text()[-2000:]}")
                time.sleep(0.1)
            yield HttpServer(url)
        finally:
            stop(process)
