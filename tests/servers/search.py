"""Private OpenSearch and Elasticsearch nodes for the tests: the real servers, on 127.0.0.1.

``opensearch_url`` / ``elasticsearch_url`` (session fixtures) start one node each from the
integ-test-zip distributions that ``tests/servers/search_install.sh`` unpacks under
``${RATEBEAM_RC:-<repo>/.rc}/search`` — single-node discovery, security off, a 512 MB heap, free
ports, data and logs in a fresh directory — wait until the cluster is yellow or green, and stop the
node (and remove its directory) at the end of the session.  Both servers refuse to run as root: as
root the node runs as the unprivileged ``ratebeam-search`` user (created by the install script).
``RATEBEAM_TEST_OPENSEARCH_URL`` / ``RATEBEAM_TEST_ELASTICSEARCH_URL`` use a running server instead.
A server that cannot be had skips its tests with the reason (fails them under ``CI=true``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from . import free_port, rc_dir, unavailable

HOST = "127.0.0.1"
USER = "ratebeam-search"
HEAP = "-Xms512m -Xmx512m"
START_TIMEOUT = 180.0


@dataclass(frozen=True)
class Engine:
    """How one distribution is found and started."""

    name: str
    #: environment variables naming the JDK and the JVM options
    java_home_var: str
    java_opts_var: str
    settings: tuple[str, ...]
    env_url: str


OPENSEARCH = Engine(
    "opensearch", "OPENSEARCH_JAVA_HOME", "OPENSEARCH_JAVA_OPTS", (), "RATEBEAM_TEST_OPENSEARCH_URL"
)
ELASTICSEARCH = Engine(
    "elasticsearch",
    "ES_JAVA_HOME",
    "ES_JAVA_OPTS",
    ("xpack.security.enabled=false", "xpack.ml.enabled=false"),
    "RATEBEAM_TEST_ELASTICSEARCH_URL",
)


class SearchUnavailable(Exception):
    """The server could not be found or started; the message says why."""


def _home(engine: Engine) -> Path:
    """The newest unpacked distribution of ``engine``."""
    candidates = sorted((rc_dir() / "search").glob(f"{engine.name}-*/bin/{engine.name}"))
    if not candidates:
        raise SearchUnavailable(
            f"{engine.name} is not installed under {rc_dir() / 'search'}: run tests/servers/search_install.sh"
        )
    return candidates[-1].parents[1]


def _java_home() -> str:
    for candidate in ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-17-openjdk-arm64"):
        if Path(candidate, "bin/java").exists():
            return candidate
    java = shutil.which("java")
    if java is None:
        raise SearchUnavailable("no Java 17 (apt-get install openjdk-17-jre-headless)")
    return str(Path(os.path.realpath(java)).parents[1])


def _health(url: str) -> str | None:
    try:
        answer = requests.get(f"{url}/_cluster/health", timeout=2)
    except requests.RequestException:
        return None
    return answer.json().get("status") if answer.ok else None


class Node:
    """One node in ``<rc>/search/run-<engine>-<id>``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.home = _home(engine)
        self.run_dir = rc_dir() / "search" / f"run-{engine.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.http_port = free_port()
        self.url = f"http://{HOST}:{self.http_port}"
        self.pid: int | None = None

    def _command(self, command: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return command
        try:
            pwd.getpwnam(USER)
        except KeyError:
            raise SearchUnavailable(f"user {USER} is missing: run tests/servers/search_install.sh") from None
        return ["runuser", "-u", USER, "--", *command]

    def start(self) -> None:
        self.run_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.run_dir, USER)
        java = _java_home()
        env = {
            **os.environ,
            "JAVA_HOME": java,
            self.engine.java_home_var: java,
            self.engine.java_opts_var: HEAP,
        }
        settings = [
            "discovery.type=single-node",
            f"network.host={HOST}",
            f"http.port={self.http_port}",
            f"transport.port={free_port()}",
            f"path.data={self.run_dir / 'data'}",
            f"path.logs={self.run_dir / 'logs'}",
            "cluster.routing.allocation.disk.threshold_enabled=false",
            *self.engine.settings,
        ]
        command = [str(self.home / "bin" / self.engine.name), "-d", "-p", str(self.run_dir / "pid")]
        reachable = subprocess.run(self._command(["test", "-x", command[0], "-a", "-w", str(self.run_dir)]),
                                   check=False, timeout=30)
        if reachable.returncode != 0:
            raise SearchUnavailable(
                f"user {USER} cannot run {command[0]} or write {self.run_dir} "
                "(a parent directory without o+x? run tests/servers/search_install.sh)"
            )
        for setting in settings:
            command += ["-E", setting]
        out = self.run_dir / "console.log"
        with out.open("wb") as console:
            done = subprocess.run(
                self._command(command), stdout=console, stderr=subprocess.STDOUT, env=env, timeout=120, check=False
            )
        if done.returncode != 0:
            raise SearchUnavailable(
                f"{self.engine.name} did not start (exit {done.returncode}): {out.read_text(errors='replace')[-1500:]}"
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            pid_file = self.run_dir / "pid"
            if self.pid is None and pid_file.exists() and pid_file.read_text().strip():
                self.pid = int(pid_file.read_text().strip())
            if _health(self.url) in ("green", "yellow"):
                return
            time.sleep(0.5)
        raise SearchUnavailable(
            f"{self.engine.name} on {self.url} not ready after {START_TIMEOUT:.0f}s; see {self.run_dir / 'logs'}"
        )

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                for _ in range(120):
                    os.kill(self.pid, 0)
                    time.sleep(0.25)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _server(engine: Engine) -> Iterator[str]:
    if os.environ.get(engine.env_url):
        url = os.environ[engine.env_url].rstrip("/")
        if _health(url) not in ("green", "yellow"):
            unavailable(f"{engine.env_url}={url} is set but the cluster is not healthy")
        yield url
        return
    try:
        node = Node(engine)
    except SearchUnavailable as err:
        unavailable(str(err))
    try:
        node.start()
    except (SearchUnavailable, OSError, subprocess.TimeoutExpired) as err:
        node.stop()
        unavailable(str(err))
    try:
        yield node.url
    finally:
        node.stop()


@pytest.fixture(scope="session")
def opensearch_url() -> Iterator[str]:
    """The base URL of a healthy OpenSearch node for this test session."""
    yield from _server(OPENSEARCH)


@pytest.fixture(scope="session")
def elasticsearch_url() -> Iterator[str]:
    """The base URL of a healthy Elasticsearch node for this test session."""
    yield from _server(ELASTICSEARCH)
