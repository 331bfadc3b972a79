"""A private Aetos 3.0.0 (OpenStack's multi-tenancy proxy for Prometheus) for the tests, on 127.0.0.1.

``aetos_server`` (session fixture) runs Aetos from its own venv (``tests/servers/keystone_install.sh``)
with gunicorn, in ``keystone`` auth mode (keystonemiddleware validates tokens against the tests'
Keystone, ``servers.keystone``), in front of a tests' Prometheus (``servers.prometheus.backfilled``)
over ``SERIES`` whose scopes ``p1``/``p2`` are relabelled with the ids of the Keystone projects
``tenant-a``/``tenant-b`` (Aetos matches a token's project *id*, and Keystone chooses the ids; the
other scopes keep their hostile ids).  Aetos' ``project_label_name`` is ``project_id``, the label
of those series.  It also registers Aetos in Keystone's catalog (service type ``metric-storage``,
public interface) and creates ``READER``, a user with only ``member`` (hence ``reader``) on
``tenant-a``: Aetos rewrites that user's queries to tenant-a's series.

A missing venv skips the tests, or fails them under ``CI=true``.  Start-up: see ``tests/servers/README.md``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from . import free_port, installed, stop, unavailable
from .keystone import KeystoneServer
from .prometheus import SERIES, PrometheusServer, Series, backfilled

READER, READER_PASSWORD = "reader-a", "reader-pass"

CONFIG = """\
[DEFAULT]
auth_mode = keystone
log_file = {root}/aetos.log
paste_config = {root}/api-paste.ini
[prometheus]
host = 127.0.0.1
port = {prometheus_port}
project_label_name = project_id
"""

WSGI = """\
from aetos import app
application = app.build_wsgi_app(argv=["--config-file", "{root}/aetos.conf"])
"""


@dataclass(frozen=True)
class AetosServer:
    """A running Aetos; ``api`` is the URL ratebeam's ``url`` takes (with ``/api/v1``)."""

    url: str
    prometheus: PrometheusServer
    keystone: KeystoneServer
    #: the Prometheus scope ids p1 and p2 became these Keystone project ids
    tenant_a: str
    tenant_b: str

    @property
    def api(self) -> str:
        return self.url + "/api/v1"


def relabelled(scopes: dict[str, str]) -> tuple[Series, ...]:
    """``SERIES`` with each ``project_id`` in ``scopes`` replaced by its new value."""
    return tuple(dataclasses.replace(s, labels={**s.labels, "project_id": scopes.get(s.labels["project_id"],
                                                                                     s.labels["project_id"])})
                 for s in SERIES)


def _paste(venv: str) -> str:
    """Aetos' own paste file, its token middleware told where the configuration is (by default
    keystonemiddleware reads ``/etc/aetos/aetos.conf``, not the ``--config-file`` Aetos was given)."""
    shipped = next(Path(venv).parent.glob("lib/python*/site-packages/aetos/api-paste.ini"))
    return shipped.read_text().replace("oslo_config_project = aetos\n",
                                       "oslo_config_project = aetos\noslo_config_file = {root}/aetos.conf\n")


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _register(keystone: KeystoneServer, url: str) -> None:
    """Aetos in the catalog, and the ``READER`` user with ``member`` on tenant-a."""
    admin = keystone.admin()
    service = admin.create("service", type="metric-storage", name="aetos")
    admin.create("endpoint", service_id=service, interface="public", url=url, region_id="RegionOne")
    member = next(r["id"] for r in admin.call("GET", "/roles")["roles"] if r["name"] == "member")
    reader = admin.create("user", name=READER, password=READER_PASSWORD, domain_id="default")
    admin.call("PUT", f"/projects/{keystone.projects['tenant-a']}/users/{reader}/roles/{member}")


@pytest.fixture(scope="session")
def aetos_server(keystone_server: KeystoneServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AetosServer]:
    """Aetos in keystone mode in front of a relabelled Prometheus (see the module docstring)."""
    venv = installed("aetos-venv/bin")
    if venv is None:
        unavailable("Aetos not installed (no aetos-venv): run tests/servers/keystone_install.sh")
    tenant_a, tenant_b = keystone_server.projects["tenant-a"], keystone_server.projects["tenant-b"]
    root = tmp_path_factory.mktemp("aetos")
    (root / "prometheus").mkdir()
    with backfilled(root / "prometheus", relabelled({"p1": tenant_a, "p2": tenant_b})) as prometheus:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        (root / "aetos.conf").write_text(CONFIG.format(
            root=root, prometheus_port=prometheus.url.rsplit(":", 1)[1]) + keystone_server.authtoken(), encoding="utf-8")
        (root / "aetos_wsgi.py").write_text(WSGI.format(root=root), encoding="utf-8")
        (root / "api-paste.ini").write_text(_paste(venv).replace("{root}", str(root)), encoding="utf-8")
        _register(keystone_server, url)
        with (root / "gunicorn.log").open("w") as log:
            process = subprocess.Popen(
                [f"{venv}/gunicorn", "--chdir", str(root), "-b", f"127.0.0.1:{port}", "-w", "1", "--threads", "4",
                 "aetos_wsgi:application"], stdout=log, stderr=subprocess.STDOUT, env={"PATH": venv})
        try:
            deadline = time.monotonic() + 60
            while not _answers(f"{url}/healthcheck"):
                if process.poll() is not None or time.monotonic() > deadline:
                    unavailable(f"Aetos did not start on {url}: {(root / 'gunicorn.log').read_text()[-2000:]}")
                time.sleep(0.2)
            yield AetosServer(url, prometheus, keystone_server, tenant_a, tenant_b)
        finally:
            stop(process)
