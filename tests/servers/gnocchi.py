"""A private Gnocchi 4.7.1 for the tests: its WSGI app under gunicorn on 127.0.0.1, basic auth.

``gnocchi_server`` (session fixture) creates a database on the tests' PostgreSQL (``pg_url``) for
Gnocchi's indexer, file storage in a temporary directory, runs ``gnocchi-upgrade``, starts the API
(gunicorn, one worker, ``auth_mode = basic``: user ``admin`` is the admin) on a free port and loads
``RESOURCES``: their resource types, an archive policy with 5-minute and 1-hour granularities, the
resources with explicit ``started_at``/``ended_at`` and their measures.

Why the measures lie *after* the fixture starts: CloudKitty's collector asks Gnocchi's aggregates
API with ``use_history=true``, which only looks at resource revisions whose ``revision_start`` (the
instant the resource was created, which no client can set) is before the period end.  So the data
starts at ``BASE``, the first whole hour after the resources are created, and the tests rate it with
``run --now`` after it.  Measures are processed by asking for them with ``refresh=true`` (the API
aggregates the backlog synchronously) rather than by ``gnocchi-metricd``: the result is the same and
the tests need neither its four processes (~250 MB) nor a wait loop.

``gnocchi_keystone_server`` (session fixture) is a second API process on the same indexer database
and storage (so the same data, and no second ``gnocchi-upgrade`` or load) in ``auth_mode = keystone``:
keystonemiddleware validates tokens against the tests' Keystone (``servers.keystone``), whose rating
user has ``admin`` on its project (Gnocchi's admin); it is in Keystone's catalog as service type
``metric`` (public and internal interfaces).

A missing venv (``tests/servers/gnocchi_install.sh``) skips the tests with the reason, or fails them
under ``CI=true``.  Tests compute their expectations from ``RESOURCES`` by hand.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from . import HttpServer, free_port, installed, stop, unavailable
from .keystone import KeystoneServer

ADMIN = ("admin", "")
HOURS = 4
#: The archive policy every metric uses: 5-minute and 1-hour buckets, the methods the tests ask for.
POLICY = {
    "name": "ratebeam",
    "back_window": 0,
    "definition": [{"granularity": "5min", "timespan": "30 days"}, {"granularity": "1h", "timespan": "365 days"}],
    "aggregation_methods": ["mean", "max", "min", "sum", "last", "count"],
}
#: Resource types and their attributes (Gnocchi's ``generic`` type has id, project_id, user_id, ...).
RESOURCE_TYPES = {
    "instance": {"flavor_name": "string", "flavor_id": "string", "vcpus": "number", "host": "string"},
    "volume": {"volume_type": "string"},
    "image": {"container_format": "string", "disk_format": "string"},
    "instance_network_interface": {"instance_id": "string"},
    "network": {"state": "string"},
}

P1 = "11111111-1111-1111-1111-111111111111"
P2 = "22222222-2222-2222-2222-222222222222"
#: A scope id that would break a search pasted as text (``{"=": {"project_id": "<id>"}}``).
HOSTILE = 'p3"}}, {"=": {"project_id": "' + P1


@dataclass(frozen=True)
class Resource:
    """One resource: attributes, lifetime in hours from ``BASE`` and measures ``metric -> ((second, value), ...)``.

    Seconds count from ``BASE``; ``None`` lifetimes mean "before the data" / "still running".
    """

    type: str
    id: str
    project_id: str
    attributes: dict[str, Any] = field(hash=False)
    measures: dict[str, tuple[tuple[int, float], ...]] = field(hash=False)
    started: float | None = None
    ended: float | None = None


def _every(step: int, value: Any, first: int = 0, last: int = HOURS * 3600) -> tuple[tuple[int, float], ...]:
    """One measure every ``step`` seconds in ``[first, last)``, 60 s into each step; ``value(second)``.

    (Measures after a resource's ``ended_at`` would make Gnocchi revive it: a new revision without end.)
    """
    return tuple((s + 60, float(value(s))) for s in range(first, last, step))


def _resources() -> tuple[Resource, ...]:
    return (
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000001", P1,
                 {"flavor_name": "m1.small", "flavor_id": "f1", "vcpus": 1, "host": "h1", "user_id": "u1"},
                 {"cpu": _every(300, lambda s: 10 + s // 300)}),
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000002", P1,  # stopped (cpu 0) in the 3rd hour
                 {"flavor_name": "m1.large", "flavor_id": "f2", "vcpus": 4, "host": "h1", "user_id": "u1"},
                 {"cpu": _every(300, lambda s: 0 if 7200 <= s < 10800 else 2.5)}),
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000003", P1,  # lives 01:30 -> 02:30 only
                 {"flavor_name": "m1.small", "flavor_id": "f1", "vcpus": 1, "host": "h2", "user_id": "u2"},
                 {"cpu": _every(300, lambda s: 7, 5400, 9000)}, started=1.5, ended=2.5),
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000004", P1,  # ended before the data
                 {"flavor_name": "m1.tiny", "flavor_id": "f0", "vcpus": 1, "host": "h2", "user_id": "u2"},
                 {"cpu": _every(3600, lambda s: 3, -6 * 3600, -3 * 3600)}, started=-6, ended=-3),
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000005", P2,
                 {"flavor_name": "m1.small", "flavor_id": "f1", "vcpus": 2, "host": "h3", "user_id": "u3"},
                 {"cpu": _every(300, lambda s: 1)}),
        Resource("instance", "aaaaaaaa-0000-0000-0000-000000000006", HOSTILE,
                 {"flavor_name": "m1.small", "flavor_id": "f1", "vcpus": 1, "host": "h4", "user_id": "u4"},
                 {"cpu": _every(300, lambda s: 1)}),
        Resource("volume", "bbbbbbbb-0000-0000-0000-000000000001", P1, {"volume_type": "ssd", "user_id": "u1"},
                 {"volume.size": _every(300, lambda s: 10 + 10 * (s // 3600))}),
        Resource("volume", "bbbbbbbb-0000-0000-0000-000000000002", P2, {"volume_type": "hdd", "user_id": "u3"},
                 {"volume.size": _every(600, lambda s: 100)}),
        Resource("image", "cccccccc-0000-0000-0000-000000000001", P1,
                 {"container_format": "bare", "disk_format": "qcow2", "user_id": "u1"},
                 {"image.size": _every(900, lambda s: 1048576 * (1 + s // 1800))}),
        Resource("instance_network_interface", "dddddddd-0000-0000-0000-000000000001", P1,
                 {"instance_id": "aaaaaaaa-0000-0000-0000-000000000001", "user_id": "u1"},
                 {"network.outgoing.bytes.rate": _every(300, lambda s: 1000 * (1 + s % 3600 // 300))}),
        Resource("network", "eeeeeeee-0000-0000-0000-000000000001", P2, {"state": "active", "user_id": "u3"},
                 {"ip.floating": _every(300, lambda s: 1 if s < 7200 else 0)}),
    )


RESOURCES = _resources()


@dataclass(frozen=True)
class GnocchiServer(HttpServer):
    """A running Gnocchi: ``url`` is its root (ratebeam's ``url`` option), ``base`` the data's first hour."""

    base: datetime = datetime(2000, 1, 1, tzinfo=UTC)
    #: its ``gnocchi.conf`` (indexer and storage: a second API process can serve the same data)
    conf: Path = Path()

    def at(self, hours: float) -> datetime:
        """``BASE`` + ``hours``."""
        return self.base + timedelta(hours=hours)


@dataclass(frozen=True)
class GnocchiKeystoneServer(HttpServer):
    """The API process in ``auth_mode = keystone`` (``url``) over the data of ``basic``."""

    basic: GnocchiServer
    keystone: KeystoneServer


#: What turns the basic configuration into the keystone one (with ``KeystoneServer.authtoken()``).
KEYSTONE_MODE = """\
[api]
auth_mode = keystone
paste_config = {paste}
"""


def _python() -> Path:
    python = installed("gnocchi-venv/bin/python")
    if python is None:
        unavailable("Gnocchi venv missing: run tests/servers/gnocchi_install.sh")
    return Path(python)  # type: ignore[arg-type]


def _create_database(pg_url: str) -> tuple[str, str]:
    """A new database on the tests' PostgreSQL: (Gnocchi's indexer URL, psycopg conninfo of the server)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    name = f"gnocchi_{uuid.uuid4().hex[:12]}"
    server = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    indexer = url.set(drivername="postgresql+psycopg2", database=name, query={})
    return indexer.render_as_string(hide_password=False), server


def _drop_database(server: str, indexer: str) -> None:
    import psycopg

    name = indexer.rsplit("/", 1)[1]
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _write_config(root: Path, indexer: str) -> Path:
    storage = root / "storage"
    storage.mkdir()
    conf = root / "gnocchi.conf"
    conf.write_text(
        f"[api]\nauth_mode = basic\n[indexer]\nurl = {indexer}\n"
        f"[storage]\ndriver = file\nfile_basepath = {storage}\n"
        f"[incoming]\ndriver = file\nfile_basepath = {storage}\n",
        encoding="utf-8",
    )
    return conf


def _keystone_config(root: Path, basic: Path, venv: Path, keystone: KeystoneServer) -> Path:
    """``basic``'s indexer and storage, ``auth_mode = keystone``; Gnocchi's paste file with its token
    middleware told where that configuration is (by default keystonemiddleware reads
    ``/etc/gnocchi/gnocchi.conf``, not the ``--config-file`` Gnocchi was given)."""
    conf, paste = root / "gnocchi.conf", root / "api-paste.ini"
    shipped = next(venv.parent.glob("lib/python*/site-packages/gnocchi/rest/api-paste.ini")).read_text()
    marker = "use = egg:keystonemiddleware#auth_token\noslo_config_project = gnocchi\n"
    paste.write_text(shipped.replace(marker, f"{marker}oslo_config_file = {conf}\n"), encoding="utf-8")
    text = basic.read_text(encoding="utf-8").replace("[api]\nauth_mode = basic\n", "")
    conf.write_text(text + KEYSTONE_MODE.format(paste=paste) + keystone.authtoken(), encoding="utf-8")
    return conf


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _load(api: str, base: datetime) -> None:
    """Archive policy, resource types, resources and measures; then the measures processed."""
    session = requests.Session()
    session.auth = ADMIN

    def post(path: str, body: Any) -> Any:
        answer = session.post(api + path, json=body, timeout=60)
        if answer.status_code >= 300:
            pytest.fail(f"gnocchi: POST {path}: HTTP {answer.status_code}: {answer.text[:500]}", pytrace=False)
        return answer.json() if answer.content else None

    post("/v1/archive_policy", POLICY)
    for name, attributes in RESOURCE_TYPES.items():
        post("/v1/resource_type", {"name": name, "attributes": {
            k: {"type": t, "required": False} for k, t in attributes.items()}})
    batch: dict[str, dict[str, list[dict[str, Any]]]] = {}
    metric_ids: list[str] = []
    for r in RESOURCES:
        body: dict[str, Any] = {"id": r.id, "project_id": r.project_id, **r.attributes,
                                "started_at": _iso(base + timedelta(hours=-24 if r.started is None else r.started)),
                                "metrics": {m: {"archive_policy_name": POLICY["name"]} for m in r.measures}}
        if r.ended is not None:
            body["ended_at"] = _iso(base + timedelta(hours=r.ended))
        created = post(f"/v1/resource/{r.type}", body)
        metric_ids += created["metrics"].values()
        batch[r.id] = {m: [{"timestamp": _iso(base + timedelta(seconds=s)), "value": v} for s, v in points]
                       for m, points in r.measures.items()}
    post("/v1/batch/resources/metrics/measures", batch)
    for metric in metric_ids:
        answer = session.get(f"{api}/v1/metric/{metric}/measures", params={"refresh": "true"}, timeout=120)
        if answer.status_code != 200:
            pytest.fail(f"gnocchi: refresh of {metric}: HTTP {answer.status_code}: {answer.text[:300]}", pytrace=False)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


@contextlib.contextmanager
def _serve(venv: Path, root: Path, conf: Path) -> Iterator[str]:
    """Gnocchi's API on ``conf`` under gunicorn (one worker) on a free port: its root URL, once it answers."""
    # gunicorn's argv would reach oslo.config: give Gnocchi its own before importing the app.
    (root / "gnocchi_wsgi.py").write_text(
        "import os, sys\n"
        'sys.argv = ["gnocchi-api", "--config-file", os.environ["GNOCCHI_CONF"]]\n'
        "from gnocchi.rest.wsgi import application  # noqa: E402,F401\n",
        encoding="utf-8",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (root / "api.log").open("w") as log:
        process = subprocess.Popen(
            [str(venv / "gunicorn"), "--chdir", str(root), "-b", f"127.0.0.1:{port}", "-w", "1",
             "--threads", "4", "gnocchi_wsgi:application"],
            stdout=log, stderr=subprocess.STDOUT, env={"GNOCCHI_CONF": str(conf), "PATH": str(venv)},
        )
    try:
        deadline = time.monotonic() + 60
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Gnocchi did not start on {url}: {(root / 'api.log').read_text()[-2000:]}",
                            pytrace=False)
            time.sleep(0.2)
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="session")
def gnocchi_server(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GnocchiServer]:
    """A private Gnocchi with ``RESOURCES`` loaded, for the whole test session."""
    python = _python()
    venv = python.parent
    root = tmp_path_factory.mktemp("gnocchi")
    indexer, server = _create_database(pg_url)
    try:
        conf = _write_config(root, indexer)
        done = subprocess.run([str(venv / "gnocchi-upgrade"), "--config-file", str(conf)],
                              capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            pytest.fail(f"gnocchi-upgrade failed: {done.stderr[-2000:]}", pytrace=False)
        with _serve(venv, root, conf) as url:
            now = datetime.now(UTC)
            base = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
            _load(url, base)
            yield GnocchiServer(url, base, conf)
    finally:
        _drop_database(server, indexer)


@pytest.fixture(scope="session")
def gnocchi_keystone_server(
    gnocchi_server: GnocchiServer, keystone_server: KeystoneServer, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GnocchiKeystoneServer]:
    """A second API process on ``gnocchi_server``'s data in ``auth_mode = keystone`` (module docstring)."""
    venv = _python().parent
    root = tmp_path_factory.mktemp("gnocchi-keystone")
    conf = _keystone_config(root, gnocchi_server.conf, venv, keystone_server)
    with _serve(venv, root, conf) as url:
        admin = keystone_server.admin()
        service = admin.create("service", type="metric", name="gnocchi")
        for interface in ("public", "internal"):
            admin.create("endpoint", service_id=service, interface=interface, url=url, region_id="RegionOne")
        yield GnocchiKeystoneServer(url, gnocchi_server, keystone_server)
