"""The ``gnocchi`` fetcher: the scopes are the values of one attribute of the resources (`cloudkitty/fetcher/gnocchi.py:87-168`).

For each resource type, CloudKitty's loop: search the resources (``details=true``) whose
``scope_attribute`` is **not in** the scopes found so far, add the new values, until a search
returns nothing — one request per page of resources of new scopes, however many resources a scope
has.  The list of known scopes goes into the search as a JSON list (``{"not": {"in": {attr: [...]}}}``),
never pasted.  Returns the distinct non-empty values **sorted** (CloudKitty's ``list(set(...))`` has no
order; a sorted list makes runs reproducible).  Gnocchi has no history of resources' attributes to
ask at an instant, so ``at`` is not used (CloudKitty's fetcher does not use one either).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ratebeam.connectors.collectors.gnocchi.client import GnocchiClient, GnocchiConnection
from ratebeam.connectors.fetchers.base import Fetcher


class GnocchiFetcher(Fetcher):
    """Lists the scope ids found on Gnocchi's resources."""

    name = "gnocchi"

    def __init__(
        self, connection: GnocchiConnection, resource_types: Sequence[str] = ("generic",),
        scope_attribute: str = "project_id", client: GnocchiClient | None = None,
    ) -> None:
        self._client = client or GnocchiClient(connection)
        self._types = tuple(resource_types)
        self._attribute = scope_attribute

    def counts(self) -> dict[str, int]:
        """The HTTP attempts to Gnocchi so far."""
        return {"gnocchi_requests": self._client.requests}

    def scopes(self, at: datetime | None = None) -> list[str]:
        """The distinct non-empty ``scope_attribute`` values of the resources of every type, sorted."""
        found: set[str] = set()
        for resource_type in self._types:
            while True:
                query: dict[str, Any] = {"not": {"in": {self._attribute: sorted(found)}}} if found else {}
                page = self._client.page(resource_type, query, details=True)
                new = {str(r[self._attribute]) for r in page if r.get(self._attribute) not in (None, "")} - found
                if not new:  # CloudKitty stops on an empty page; a page without new scopes would loop
                    break
                found |= new
        return sorted(found)

    def close(self) -> None:
        """Close the HTTP client's connection pool."""
        self._client.close()
