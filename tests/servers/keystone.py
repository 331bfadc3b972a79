"""A private Keystone 30.0.0 for the tests: SQLite, Fernet tokens, gunicorn, on a free 127.0.0.1 port.

``keystone_server`` (session fixture) copies the
database and keys ``keystone_install.sh`` made once with ``keystone-manage`` ``db_sync``,
``fernet_setup``, ``credential_setup`` and ``bootstrap`` (admin / ``ADMIN_PASSWORD``; about 35 s on
busy cores, not paid per session) into a fresh directory and serves it with gunicorn (uwsgi resets
keystoneauth's keep-alive connections), with an access log the tests count requests in, bcrypt at
its cheapest (``password_hash_rounds = 4``: every token costs a hash) and ``[resource] list_limit =
4`` so the project list comes in pages.  It then creates, through Keystone's REST API:

* domains ``dom-a`` (enabled) and ``dom-off`` (disabled once populated);
* the ``rating`` role and the rating user ``cloudkitty`` (``RATING_PASSWORD``, domain ``default``)
  with ``admin`` on project ``service`` (listing projects needs it) and an application credential;
* projects — ``default``: ``tenant-a``, ``tenant-b`` (rating), ``tenant-c`` (none), ``tenant-off``
  (rating, disabled); ``dom-a``: ``tenant-d`` (rating), ``tenant-e`` (only ``member``);
  ``dom-off``: ``tenant-f`` (rating); and the rating role on the domain ``dom-a`` itself, which
  makes no project rated.

A missing venv or template (``tests/servers/keystone_install.sh``) skips the tests, or fails them under ``CI=true``.
Start-up: 20-35 s with the population, about 160 MB resident (``tests/servers/README.md``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from . import HttpServer, free_port, installed, stop, unavailable

ADMIN_PASSWORD = "secret"  # keystone_install.sh bootstraps the template with it
RATING_USER, RATING_PASSWORD = "cloudkitty", "ck-pass"
#: project name -> (domain name, rating role?, enabled?)
PROJECTS = {
    "tenant-a": ("default", True, True), "tenant-b": ("default", True, True),
    "tenant-c": ("default", False, True), "tenant-off": ("default", True, False),
    "tenant-d": ("dom-a", True, True), "tenant-e": ("dom-a", False, True),
    "tenant-f": ("dom-off", True, True),
}

CONFIG = """\
[DEFAULT]
log_file = {root}/keystone.log
[database]
connection = sqlite:///{root}/keystone.db
[token]
provider = fernet
[fernet_tokens]
key_repository = {root}/fernet-keys
[fernet_receipts]
key_repository = {root}/fernet-keys
[credential]
key_repository = {root}/credential-keys
[identity]
password_hash_rounds = 4
[resource]
list_limit = 4
"""

WSGI = """\
import sys
sys.argv = sys.argv[:1]  # keystone parses sys.argv with oslo.config; hide gunicorn's flags
from keystone.wsgi.api import application  # noqa: E402,F401
"""


@dataclass(frozen=True)
class KeystoneServer(HttpServer):
    """A running, populated Keystone; ``api`` is its v3 endpoint (ratebeam's ``url``)."""

    api_path = "/v3"
    root: Path = field(default=Path())
    #: project name -> id (``admin`` and ``service`` included)
    projects: dict[str, str] = field(default_factory=dict, hash=False)
    app_credential_id: str = ""
    app_credential_secret: str = ""

    @property
    def access_log(self) -> Path:
        """gunicorn's access log: one line per request (``"GET /v3/role_assignments?..."``)."""
        return self.root / "access.log"

    def requests_to(self, path: str, since: int = 0) -> int:
        """How many requests of the access log after byte ``since`` went to ``path``."""
        time.sleep(0.2)  # gunicorn writes the line after the answer
        with self.access_log.open("rb") as log:
            log.seek(since)
            return sum(1 for line in log.read().decode().splitlines() if f" {path}" in line)

    def log_size(self) -> int:
        """The access log's size once it stopped growing (give it to ``requests_to`` as ``since``).

        gunicorn writes a line after its answer: taken at once, the size could leave the lines of
        the previous test's last requests to be counted as the next ones'.
        """
        size = -1
        while size != (size := self.access_log.stat().st_size):
            time.sleep(0.2)
        return size

    def admin(self) -> KeystoneApi:
        """Keystone's REST API with a token of the bootstrap admin."""
        return KeystoneApi(self.api, token(self.api, "admin", ADMIN_PASSWORD, "admin").headers["X-Subject-Token"])

    def authtoken(self) -> str:
        """keystonemiddleware's ``[keystone_authtoken]`` section for a service (Aetos, Gnocchi) that
        validates tokens against this Keystone, as its bootstrap admin."""
        return ("[keystone_authtoken]\nauth_type = password\n"
                f"auth_url = {self.api}\nwww_authenticate_uri = {self.api}\n"
                f"username = admin\npassword = {ADMIN_PASSWORD}\nuser_domain_id = default\n"
                "project_name = admin\nproject_domain_id = default\n")

    def rated(self, *, ignore_rating_role: bool = False, ignore_disabled: bool = False) -> set[str]:
        """The ids CloudKitty's fetcher would return with these options."""
        chosen = set()
        for name, project_id in self.projects.items():
            _, rating, enabled = PROJECTS.get(name, ("default", False, True))
            if (rating or ignore_rating_role) and (enabled or not ignore_disabled):
                chosen.add(project_id)
        return chosen


class KeystoneApi:
    """Just enough of Keystone's REST API to populate it (admin token, JSON in and out)."""

    def __init__(self, api: str, token: str) -> None:
        self.api, self.headers = api, {"X-Auth-Token": token}

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        answer = requests.request(method, self.api + path, json=body, headers=self.headers, timeout=30)
        assert answer.status_code < 300, (method, path, answer.status_code, answer.text)
        return answer.json() if answer.content else {}

    def create(self, kind: str, **attributes) -> str:
        return self.call("POST", f"/{kind}s", {kind: attributes})[kind]["id"]


def token(api: str, user: str, password: str, project: str, domain: str = "default") -> requests.Response:
    """``POST /v3/auth/tokens`` (password, project-scoped); the token is the answer's ``X-Subject-Token``."""
    return requests.post(f"{api}/auth/tokens", timeout=30, json={"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": user, "domain": {"id": domain}, "password": password}}},
        "scope": {"project": {"name": project, "domain": {"id": domain}}}}})


def _populate(api: str) -> tuple[dict[str, str], str, str]:
    admin = KeystoneApi(api, token(api, "admin", ADMIN_PASSWORD, "admin").headers["X-Subject-Token"])
    # The catalog's identity endpoints (what `bootstrap --bootstrap-*-url` makes; the template has no port)
    found = admin.call("GET", "/services?type=identity")["services"]
    identity = found[0]["id"] if found else admin.create("service", type="identity", name="keystone")
    for interface in ("public", "internal", "admin"):
        admin.create("endpoint", service_id=identity, interface=interface, url=api, region_id="RegionOne")
    domains = {"default": "default", "dom-a": admin.create("domain", name="dom-a"),
               "dom-off": admin.create("domain", name="dom-off")}
    roles = {r["name"]: r["id"] for r in admin.call("GET", "/roles")["roles"]}
    rating = admin.create("role", name="rating")
    user = admin.create("user", name=RATING_USER, password=RATING_PASSWORD, domain_id="default")
    projects = {p["name"]: p["id"] for p in admin.call("GET", "/projects?name=admin")["projects"]}
    projects["service"] = admin.create("project", name="service", domain_id="default")
    admin.call("PUT", f"/projects/{projects['service']}/users/{user}/roles/{roles['admin']}")
    for name, (domain, has_rating, _) in PROJECTS.items():
        projects[name] = admin.create("project", name=name, domain_id=domains[domain])
        role = rating if has_rating else roles["member"]
        admin.call("PUT", f"/projects/{projects[name]}/users/{user}/roles/{role}")
    admin.call("PUT", f"/domains/{domains['dom-a']}/users/{user}/roles/{rating}")
    admin.call("PATCH", f"/projects/{projects['tenant-off']}", {"project": {"enabled": False}})
    admin.call("PATCH", f"/domains/{domains['dom-off']}", {"domain": {"enabled": False}})
    mine = KeystoneApi(api, token(api, RATING_USER, RATING_PASSWORD, "service").headers["X-Subject-Token"])
    credential = mine.call("POST", f"/users/{user}/application_credentials",
                           {"application_credential": {"name": "ratebeam"}})["application_credential"]
    return projects, credential["id"], credential["secret"]


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/v3", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="session")
def keystone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeystoneServer]:
    """A private, populated Keystone for the whole test session (see the module docstring)."""
    venv, template = installed("keystone-venv/bin"), installed("keystone-template/keystone.db")
    if venv is None or template is None:
        unavailable("Keystone not installed (no keystone-venv or keystone-template): "
                    "run tests/servers/keystone_install.sh")
    root = tmp_path_factory.mktemp("keystone")
    shutil.copytree(Path(template).parent, root, dirs_exist_ok=True)
    (root / "keystone.conf").write_text(CONFIG.format(root=root), encoding="utf-8")
    (root / "ks_wsgi.py").write_text(WSGI, encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"OS_KEYSTONE_CONFIG_FILES": str(root / "keystone.conf"), "PATH": venv}
    with (root / "gunicorn.log").open("w") as log:
        process = subprocess.Popen(
            [f"{venv}/gunicorn", "--chdir", str(root), "-b", f"127.0.0.1:{port}", "-w", "1", "--threads", "4",
             "--access-logfile", str(root / "access.log"), "ks_wsgi:application"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                unavailable(f"Keystone did not start on {url}: {(root / 'gunicorn.log').read_text()[-2000:]}")
            time.sleep(0.2)
        projects, credential_id, secret = _populate(f"{url}/v3")
        yield KeystoneServer(url, root, projects, credential_id, secret)
    finally:
        stop(process)
