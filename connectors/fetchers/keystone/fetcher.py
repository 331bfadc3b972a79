"""The ``keystone`` fetcher: CloudKitty's Keystone fetcher (`cloudkitty/fetcher/keystone.py:55-105`) in two requests, not 1 + N.

CloudKitty lists every project, then asks Keystone for the rating user's roles on each project in
turn (``GET /v3/projects/{p}/users/{u}/roles``: one request per project, every cycle).  Here one
``GET /v3/role_assignments?user.id=<u>&include_names=true`` gives the same direct assignments of
the user for all projects at once; a project is kept when one of them names the role ``rating`` on
it (CloudKitty compares role *names*; group, domain-level and inherited assignments count for
neither).  ``ignore_rating_role`` skips that request and keeps every project;
``ignore_disabled_tenants`` drops the projects whose own ``enabled`` is false.  Like CloudKitty,
a project of a disabled domain is kept: Keystone lists it with its own ``enabled`` flag, and
CloudKitty never looks at domains.  The project list follows Keystone's ``links.next`` when the
server paginates (``list_limit``).  Scope ids are returned sorted (CloudKitty keeps Keystone's
order; sorted makes runs reproducible).

Each HTTP request counts in ``requests`` (the run's ``keystone_requests``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.fetchers.base import Fetcher
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.fetchers.keystone.session import KeystoneSession, KeystoneToken
from ratebeam.connectors.http import HttpClient, HttpResponse

#: The role CloudKitty's fetcher looks for (by name, ``fetcher/keystone.py``).
RATING_ROLE = "rating"
#: A bound on Keystone's pages: a server whose ``next`` links never end cannot hold a run.
MAX_PAGES = 10_000


class KeystoneFetcher(Fetcher):
    """Lists the ids of the projects to rate; see the module docstring."""

    name = "keystone"

    def __init__(
        self, credentials: KeystoneCredentials, ignore_rating_role: bool = False,
        ignore_disabled_tenants: bool = False, keystone: KeystoneSession | None = None,
    ) -> None:
        self.keystone = keystone or KeystoneSession(credentials)
        self._ignore_rating_role = ignore_rating_role
        self._ignore_disabled = ignore_disabled_tenants
        self._http = HttpClient(credentials.http_settings(credentials.url, "keystone"),
                                auth=KeystoneToken(self.keystone))

    @property
    def requests(self) -> int:
        """HTTP attempts to Keystone's API so far (token requests not included)."""
        return self._http.attempts

    def counts(self) -> dict[str, int]:
        """The HTTP attempts to Keystone so far."""
        return {"keystone_requests": self.requests}

    def scopes(self, at: datetime | None = None) -> list[str]:
        """The ids of the projects to rate now (``at`` is ignored: Keystone has no history), sorted."""
        projects = self._projects()
        if self._ignore_disabled:
            projects = [p for p in projects if p.get("enabled") is not False]
        ids = {str(p["id"]) for p in projects}
        if not self._ignore_rating_role:
            ids &= self._rated_projects()
        return sorted(ids)

    def _projects(self) -> list[dict[str, Any]]:
        """Every project Keystone lists (``GET /v3/projects``, following ``links.next``)."""
        found: list[dict[str, Any]] = []
        path: str | None = "/projects"
        for _ in range(MAX_PAGES):
            if path is None:
                return found
            body = self._get(path)
            projects = body.get("projects")
            if not isinstance(projects, list) or not all(isinstance(p, dict) and p.get("id") for p in projects):
                raise self._malformed(path, "'projects' is not a list of projects with an id", body)
            found += projects
            path = self._next(body)
        raise FatalConnectorError(f"{self._http.where('/projects')}: more than {MAX_PAGES} pages of projects")

    def _rated_projects(self) -> set[str]:
        """The projects where the user has a direct ``rating`` role assignment: one request."""
        path = "/role_assignments"
        body = self._get(path, params={"user.id": self.keystone.user_id(), "include_names": "true"})
        assignments = body.get("role_assignments")
        if not isinstance(assignments, list) or not all(isinstance(a, dict) for a in assignments):
            raise self._malformed(path, "'role_assignments' is not a list of objects", body)
        rated = set()
        for assignment in assignments:
            role, scope = assignment.get("role") or {}, assignment.get("scope") or {}
            project = scope.get("project") if isinstance(scope, dict) else None
            inherited = isinstance(scope, dict) and "OS-INHERIT:inherited_to" in scope
            if isinstance(role, dict) and role.get("name") == RATING_ROLE and isinstance(project, dict) \
                    and project.get("id") and not inherited:
                rated.add(str(project["id"]))
        return rated

    def _get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        response: HttpResponse = self._http.request("GET", path, **kwargs)
        try:
            body = response.json()
        except ValueError as exc:
            raise FatalConnectorError(f"{self._http.where(path)}: answer is {exc}") from None
        if not isinstance(body, dict):
            raise self._malformed(path, "the answer is not a JSON object", body)
        return body

    def _next(self, body: dict[str, Any]) -> str | None:
        """The path of Keystone's next page (its ``links.next`` must point below our URL), or None."""
        links = body.get("links")
        following = links.get("next") if isinstance(links, dict) else None
        if not following:
            return None
        base = urlsplit(self._http.base)
        link = urlsplit(str(following))
        if (link.scheme, link.netloc) != (base.scheme, base.netloc) or not link.path.startswith(base.path):
            raise FatalConnectorError(f"{self._http.where('/projects')}: the next page is elsewhere: {following}")
        return link.path[len(base.path):] + (f"?{link.query}" if link.query else "")

    def _malformed(self, path: str, problem: str, body: Any) -> FatalConnectorError:
        return FatalConnectorError(f"{self._http.where(path)}: malformed answer ({problem}): {str(body)[:200]}")

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        self._http.close()
