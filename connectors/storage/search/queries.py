"""Query JSON for the search backends: mapping, selections, sort, sums, composite totals.

Filters are always structured query clauses (``terms`` on a field, values as JSON values), never
pasted into query strings, so no value can change a query's meaning.  A label filter matches the
groupby *or* the metadata label of that name: ``bool.should`` of both with ``minimum_should_match``
1 per key (CloudKitty puts every key's two clauses in one ``should`` with ``minimum_should_match`` =
number of keys, so any N of the 2N terms satisfy it; a fault not reproduced).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ratebeam.connectors.storage.base import TIME, Selection
from ratebeam.connectors.storage.json_lines import ID_KEY, SCOPE_KEY
from ratebeam.connectors.storage.search.flavor import EngineFlavor
from ratebeam.transforms.schema import TYPE

#: Fields ratebeam adds to CloudKitty's document (``json_lines``); the point id is a sortable copy
#: of ``_id`` (Elasticsearch 8 refuses to sort on ``_id``).
SCOPE_FIELD, ID_FIELD = SCOPE_KEY, ID_KEY
#: Buckets per composite aggregation page (CloudKitty's value).
COMPOSITE_PAGE = 5000


def mapping(flavor: EngineFlavor) -> dict[str, Any]:
    """CloudKitty's index mapping (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`) plus the scope and point id, without date detection.

    ``date_detection`` is off: with it a label whose first value looks like a date becomes a date
    field and every later non-date value of that label is rejected.
    """
    string = flavor.string_mapping()
    return {
        "dynamic": False,
        "date_detection": False,
        "numeric_detection": False,
        "dynamic_templates": [{"strings_as_keywords": {"match_mapping_type": "string", "mapping": string}}],
        "properties": {
            "start": {"type": "date"},
            "end": {"type": "date"},
            "type": string,
            "unit": string,
            "qty": {"type": "double"},
            "price": {"type": "double"},
            "groupby": {"dynamic": True, "type": "object"},
            "metadata": {"dynamic": True, "type": "object"},
            SCOPE_FIELD: string,
            ID_FIELD: string,
        },
    }


def iso(moment: datetime) -> str:
    """A bound as the engines parse it (``strict_date_optional_time``)."""
    return moment.isoformat()


def scope_clause(scopes: list[str], flavor: EngineFlavor, scope_key: str | None) -> dict[str, Any]:
    """Documents of ``scopes``: ratebeam's ``scope_id`` or, with ``scope_key``, CloudKitty's label.

    CloudKitty's documents have no ``scope_id``, only ``groupby.<scope_key>``; ratebeam's carry
    both (the collector groups by the scope key), so the second term adds exactly CloudKitty's.
    """
    own = {"terms": {flavor.keyword(SCOPE_FIELD): scopes}}
    if scope_key is None:
        return own
    theirs = {"terms": {flavor.keyword(f"groupby.{scope_key}"): scopes}}
    return {"bool": {"should": [own, theirs], "minimum_should_match": 1}}


def selection_clauses(
    selection: Selection, flavor: EngineFlavor, scope_key: str | None = None
) -> list[dict[str, Any]]:
    """``filter`` clauses for types, scopes and labels (call only when ``not selection.empty``).

    ``scope_key``: a scope also selects CloudKitty's documents (:func:`scope_clause`).
    """
    clauses: list[dict[str, Any]] = []
    if selection.types is not None:
        clauses.append({"terms": {flavor.keyword(TYPE): sorted(selection.types)}})
    if selection.scopes is not None:
        clauses.append(scope_clause(sorted(selection.scopes), flavor, scope_key))
    for key, values in sorted(selection.labels.items()):
        accepted = sorted(values)
        clauses.append(
            {
                "bool": {
                    "should": [
                        {"terms": {flavor.keyword(f"groupby.{key}"): accepted}},
                        {"terms": {flavor.keyword(f"metadata.{key}"): accepted}},
                    ],
                    "minimum_should_match": 1,
                }
            }
        )
    return clauses


def window_query(
    selection: Selection, flavor: EngineFlavor, begin: datetime, end: datetime, scope_key: str | None = None
) -> dict[str, Any]:
    """``begin <= start`` and ``end <= end`` (retrieve and total) with the selection.

    With ``scope_key``, a scope also selects CloudKitty's documents, as deletes do.
    """
    clauses = [{"range": {"start": {"gte": iso(begin)}}}, {"range": {"end": {"lte": iso(end)}}}]
    return {"bool": {"filter": clauses + selection_clauses(selection, flavor, scope_key)}}


def delete_query(
    selection: Selection, flavor: EngineFlavor, begin: datetime | None, end: datetime | None,
    scope_key: str | None = None,
) -> dict[str, Any]:
    """``begin <= start < end`` (open when None) with the selection, scope included (`cloudkitty/storage/v2/elasticsearch/client.py:369-383`)."""
    bounds: dict[str, str] = {}
    if begin is not None:
        bounds["gte"] = iso(begin)
    if end is not None:
        bounds["lt"] = iso(end)
    clauses = [{"range": {"start": bounds}}] if bounds else []
    return {"bool": {"filter": clauses + selection_clauses(selection, flavor, scope_key)}}


def stale_query(
    slices: list[tuple[str, str, datetime]], keep_ids: list[str], flavor: EngineFlavor,
    scope_key: str | None = None,
) -> dict[str, Any]:
    """Documents of the (scope, type, begin) ``slices`` whose id is not in ``keep_ids``."""
    should = [
        {
            "bool": {
                "filter": [
                    scope_clause([scope], flavor, scope_key),
                    {"term": {flavor.keyword(TYPE): type_}},
                    {"term": {"start": iso(begin)}},
                ]
            }
        }
        for scope, type_, begin in slices
    ]
    return {
        "bool": {
            "should": should,
            "minimum_should_match": 1,
            "must_not": [{"ids": {"values": keep_ids}}],
        }
    }


def retrieve_sort(flavor: EngineFlavor) -> list[dict[str, Any]]:
    """A total order: period begin, scope, type, then the point id (unique)."""
    return [
        {"start": {"order": "asc"}},
        {flavor.keyword(SCOPE_FIELD): {"order": "asc", "unmapped_type": "keyword"}},
        {flavor.keyword(TYPE): {"order": "asc"}},
        {flavor.keyword(ID_FIELD): {"order": "asc", "unmapped_type": "keyword"}},
    ]


SUMS = {"sum_qty": {"sum": {"field": "qty"}}, "sum_price": {"sum": {"field": "price"}}}


def composite_sources(keys: tuple[str, ...], flavor: EngineFlavor) -> list[dict[str, Any]]:
    """One composite source per total key (``time`` = period begin and end), named ``k<i>``.

    Names are positional so that a label called ``begin`` or ``qty`` cannot clash.  A point without
    the label falls in the ``null`` bucket (``missing_bucket``), read back as ``''``.
    """
    sources: list[dict[str, Any]] = []
    for key in keys:
        if key == TIME:
            fields = ["start", "end"]
        elif key == TYPE:
            fields = [flavor.keyword(TYPE)]
        else:
            fields = [flavor.keyword(f"groupby.{key}")]
        for field in fields:
            terms = {"field": field, "missing_bucket": True}
            sources.append({f"k{len(sources)}": {"terms": terms}})
    return sources
