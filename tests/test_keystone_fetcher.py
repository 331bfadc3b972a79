"""The Keystone fetcher against the real test Keystone 30.0.0 (``servers.keystone``), and its section
of ratebeam.yaml."""

from __future__ import annotations

import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml
from pipeline_support import run_cycle, workspace
from servers import keystone as keystone_servers
from servers.keystone import ADMIN_PASSWORD, RATING_PASSWORD, RATING_USER, KeystoneServer

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.fetchers.keystone.fetcher import KeystoneFetcher
from ratebeam.connectors.registry import make_fetcher
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.errors import InputError

keystone_server = keystone_servers.keystone_server  # the session fixture


def password_auth(server: KeystoneServer, password: str = RATING_PASSWORD, **overrides) -> KeystoneCredentials:
    fields = {"username": RATING_USER, "password": password, "user_domain_id": "default",
              "project_name": "service", "project_domain_id": "default", "timeout": 10, "retries": 0}
    return KeystoneCredentials(server.api, **{**fields, **overrides})


def fetcher(server: KeystoneServer, **options) -> KeystoneFetcher:
    return KeystoneFetcher(password_auth(server), **options)


def test_scopes_are_the_projects_with_the_rating_role(keystone_server):
    """Direct ``rating`` grants count; ``member`` and the domain-level grant do not; the disabled
    project and the project of the disabled domain are kept, as CloudKitty keeps them."""
    projects = keystone_server.projects
    scopes = fetcher(keystone_server).scopes()
    assert set(scopes) == keystone_server.rated()
    assert set(scopes) == {projects[n] for n in ("tenant-a", "tenant-b", "tenant-off", "tenant-d", "tenant-f")}
    assert scopes == sorted(scopes)


def test_ignore_disabled_tenants_drops_the_disabled_project_only(keystone_server):
    scopes = set(fetcher(keystone_server, ignore_disabled_tenants=True).scopes())
    assert scopes == keystone_server.rated(ignore_disabled=True)
    assert keystone_server.projects["tenant-off"] not in scopes
    assert keystone_server.projects["tenant-f"] in scopes  # its domain is disabled, the project is not


def test_ignore_rating_role_lists_every_project(keystone_server):
    scopes = set(fetcher(keystone_server, ignore_rating_role=True).scopes())
    assert scopes == keystone_server.rated(ignore_rating_role=True)
    assert {keystone_server.projects[n] for n in ("admin", "service", "tenant-c", "tenant-e")} <= scopes
    both = set(fetcher(keystone_server, ignore_rating_role=True, ignore_disabled_tenants=True).scopes())
    assert both == keystone_server.rated(ignore_rating_role=True, ignore_disabled=True)


def test_one_role_assignment_request_and_one_token_per_fetcher(keystone_server):
    """CloudKitty asks once per project; here: one role-assignment request per fetch, the project
    list in pages (``list_limit = 4``), and one token for several fetches."""
    f = fetcher(keystone_server)
    since = keystone_server.log_size()
    f.scopes()
    assert keystone_server.requests_to("/v3/role_assignments", since) == 1
    pages = keystone_server.requests_to("/v3/projects", since)
    assert pages == len(keystone_server.projects) // 4 + 1  # every page read (10 projects, 4 a page)
    f.scopes()
    assert keystone_server.requests_to("/v3/role_assignments", since) == 2
    assert keystone_server.requests_to("/v3/auth/tokens", since) == 1  # the token was re-used
    f.keystone.invalidate()  # as when it expires: keystoneauth authenticates again
    assert set(f.scopes()) == keystone_server.rated()
    assert keystone_server.requests_to("/v3/auth/tokens", since) == 2
    since = keystone_server.log_size()
    fetcher(keystone_server, ignore_rating_role=True).scopes()
    assert keystone_server.requests_to("/v3/role_assignments", since) == 0


def test_application_credential(keystone_server):
    credentials = KeystoneCredentials(
        keystone_server.api, application_credential_id=keystone_server.app_credential_id,
        application_credential_secret=keystone_server.app_credential_secret, timeout=10, retries=0)
    assert set(KeystoneFetcher(credentials).scopes()) == keystone_server.rated()


def test_wrong_password_and_keystone_down(keystone_server):
    with pytest.raises(FatalConnectorError, match="authentication refused: HTTP 401") as info:
        KeystoneFetcher(password_auth(keystone_server, "wrong-pass")).scopes()
    assert "wrong-pass" not in str(info.value)
    from servers import free_port

    down = KeystoneCredentials(f"http://127.0.0.1:{free_port()}/v3", username="u", password="p",
                               user_domain_id="default", project_id="x", timeout=2, retries=1, backoff=0.01)
    with pytest.raises(RetriableConnectorError, match="keystone http://127.0.0.1:"):
        KeystoneFetcher(down).scopes()


def test_a_user_without_admin_cannot_list_projects(keystone_server):
    """Keystone's 403 on the project list is fatal: no retry makes the role appear."""
    with pytest.raises(FatalConnectorError, match="authentication refused: HTTP 403"):
        KeystoneFetcher(password_auth(keystone_server, project_name="tenant-a")).scopes()


# ---- ratebeam.yaml and `ratebeam run` ----


def keystone_section(server: KeystoneServer, **overrides) -> dict:
    section = {"backend": "keystone", "url": server.api, "username": RATING_USER, "password": RATING_PASSWORD,
               "user_domain_name": "Default", "project_name": "service", "project_domain_name": "Default",
               "retries": 1, "backoff": 0.1, "timeout": 10}
    return {**section, **overrides}


def configured(tmp_path: Path, fetcher_section: dict | None = None, **sections) -> Path:
    """The demo workspace with these sections of ratebeam.yaml (``fetcher_section``: its fetcher)."""
    config = workspace(tmp_path / "ws")
    doc = yaml.safe_load(config.read_text())
    doc.update(sections, **({"fetcher": fetcher_section} if fetcher_section else {}))
    config.write_text(yaml.safe_dump(doc))
    return config


def test_config_section_builds_the_fetcher(tmp_path, keystone_server):
    config = load_config(configured(tmp_path, keystone_section(keystone_server, ignore_disabled_tenants=True)))
    assert config.fetcher.credentials.user_domain_name == "Default"
    assert "ck-pass" not in repr(config.fetcher.credentials)
    assert set(make_fetcher(config.fetcher).scopes()) == keystone_server.rated(ignore_disabled=True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"url": "http://k:5000"}, "fetcher.url: must end with /v3"),
        ({"password": None}, "fetcher: give username and password, or an application credential"),
        ({"user_domain_name": None}, "fetcher.username: username needs user_domain_name or user_domain_id"),
        ({"project_name": None}, "fetcher: give project_name or project_id"),
        ({"application_credential_secret": "s"}, "fetcher.password: use either password or an application"),
        ({"certfile": "nope.pem"}, "fetcher.certfile: no such file"),
        ({"ignore_rating_role": "yes"}, "fetcher.ignore_rating_role: expected true or false: 'yes'"),
        ({"region": "r"}, "fetcher.region: unknown key"),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, message):
    server = KeystoneServer("http://k:5000")
    section = {k: v for k, v in keystone_section(server, **overrides).items() if v is not None}
    with pytest.raises(InputError) as info:
        load_config(configured(tmp_path, section))
    assert message in str(info.value)


def test_wrong_password_stops_ratebeam_run_with_one_line(tmp_path, keystone_server):
    config = configured(tmp_path, keystone_section(keystone_server, password="not-" + ADMIN_PASSWORD))
    engine = make_engine(f"sqlite:///{config.parent / 'ratebeam.db'}")
    upgrade(engine)  # in process: no rules are needed to fail at the fetch (and two CLI starts are saved)
    done = run_cycle(config)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert f"keystone {keystone_server.api}: authentication refused: HTTP 401" in lines[0]
    assert "Traceback" not in done.stderr and "not-" + ADMIN_PASSWORD not in done.stderr + done.stdout
    with engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM ratebeam_dead_letters")).scalar() == 0
    engine.dispose()


# ---- one retry layer: Keystone answering 503 (a proxy in front of the real server) ----


class _Flaky(BaseHTTPRequestHandler):
    """Forwards to the real Keystone, except that the first ``fail[path]`` requests to a path get 503."""

    upstream = ""
    fail: dict[str, int] = {}
    seen: dict[str, int] = {}

    def _forward(self) -> None:
        path = self.path.split("?")[0]
        self.seen[path] = self.seen.get(path, 0) + 1
        if self.seen[path] <= self.fail.get(path, 0):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "connection")}
        answer = requests.request(self.command, self.upstream + self.path, data=body, headers=headers, timeout=30)
        self.send_response(answer.status_code)
        for key in ("Content-Type", "X-Subject-Token"):
            if key in answer.headers:
                self.send_header(key, answer.headers[key])
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def flaky(keystone_server):
    """A proxy URL (``.../v3``) in front of Keystone, and the handler class to script and count."""
    _Flaky.upstream, _Flaky.fail, _Flaky.seen = keystone_server.url, {}, {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v3", _Flaky
    httpd.shutdown()
    httpd.server_close()


def test_503s_are_retried_once_each_in_one_layer(keystone_server, flaky):
    """Token requests are retried by keystoneauth, API calls by ratebeam's HTTP layer: each 503 costs
    exactly one more attempt (no layer retries another layer's retries)."""
    url, handler = flaky
    handler.fail = {"/v3/auth/tokens": 2, "/v3/role_assignments": 2}
    credentials = replace(password_auth(keystone_server), url=url, retries=2, backoff=0.01)
    assert set(KeystoneFetcher(credentials).scopes()) == keystone_server.rated()
    assert handler.seen["/v3/auth/tokens"] == 3 and handler.seen["/v3/role_assignments"] == 3


def test_503s_beyond_the_retries_are_retriable(keystone_server, flaky):
    url, handler = flaky
    handler.fail = {"/v3/auth/tokens": 5}
    credentials = replace(password_auth(keystone_server), url=url, retries=1, backoff=0.01)
    with pytest.raises(RetriableConnectorError, match="HTTP 503"):
        KeystoneFetcher(credentials).scopes()
    assert handler.seen["/v3/auth/tokens"] == 2
