"""The JSON CloudKitty's Gnocchi collector sends (`cloudkitty/collector/gnocchi.py:263-596`), built as data.

Why a module of its own: the operations and searches are the contract with CloudKitty, and the one
place scope ids enter a Gnocchi request.  They are JSON values inside structured filters
(``{"=": {"project_id": <id>}}``), never text pasted into a query string, so a scope id such as
``p"}}, {"=": {"project_id": "x`` stays one string value.  The one text CloudKitty lets a user
write, ``custom_query``, is its own operations template, substituted as CloudKitty does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ratebeam.transforms.metric_defs import GnocchiExtraArgs, MetricDef


def operations(metric: MetricDef, args: GnocchiExtraArgs) -> list[Any] | str:
    """``["aggregate", <re_aggregation>, ["metric", <name>, <aggregation>]]`` or the ``custom_query``.

    ``custom_query`` is substituted with plain ``str.replace`` in CloudKitty's order
    (``RE_AGGREGATION_METHOD`` first, ``collector/gnocchi.py:396-417``).
    """
    if args.custom_query:
        return (args.custom_query.replace("RE_AGGREGATION_METHOD", args.re_aggregation_method)
                .replace("AGGREGATION_METHOD", args.aggregation_method).replace("METRIC_NAME", metric.name))
    return ["aggregate", args.re_aggregation_method, ["metric", metric.name, args.aggregation_method]]


def aggregates_search(resource_type: str, scope_key: str, scope_id: str | None) -> dict[str, Any]:
    """The aggregates search: the resource type, and the scope unless every scope is collected at once."""
    by_type = {"=": {"type": resource_type}}
    if scope_id is None:
        return by_type
    return {"and": [by_type, {"=": {scope_key: scope_id}}]}


def aggregates_start(begin: datetime, args: GnocchiExtraArgs) -> datetime:
    """The aggregates ``start``: one ``force_granularity`` earlier for a ``rate:`` re-aggregation (two points)."""
    if args.re_aggregation_method.startswith("rate:"):
        return begin - timedelta(seconds=args.force_granularity)
    return begin


def lifetime_search(begin: datetime, end: datetime, scope_key: str, scope_id: str | None) -> dict[str, Any]:
    """The resources alive around ``[begin, end)``, widened by one period each side as CloudKitty does.

    (``collector/gnocchi.py:263-310``: not ended before ``begin - period``, started by ``end + period``.)
    """
    period = end - begin
    filters: list[dict[str, Any]] = [
        {"or": [{"=": {"ended_at": None}}, {">=": {"ended_at": (begin - period).isoformat()}}]},
        {"<=": {"started_at": (end + period).isoformat()}},
    ]
    if scope_id is not None:
        filters.append({"=": {scope_key: scope_id}})
    return {"and": filters}
