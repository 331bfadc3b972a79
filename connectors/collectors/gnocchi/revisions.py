"""CloudKitty's ``use_all_resource_revisions: false`` (``collector/gnocchi.py:495-596``), as data in, data out.

With ``use_history`` Gnocchi returns one group per revision of a resource whose groupby attributes
changed in the period.  CloudKitty then keeps, per ``id``, the group of the last revision (sorted by
``(id, revision_start)``) for its attributes, and makes its quantity the sum of the first aggregate
of every group of that id that has exactly one aggregate (the kept group's own value counts only
through that sum when it has one aggregate; with several it is kept and the others are added).
Without an ``id`` groupby key nothing can be matched and the groups are returned as they are.
"""

from __future__ import annotations

import copy
from typing import Any


def _aggregated(group: dict[str, Any]) -> list[Any]:
    return group["measures"]["measures"]["aggregated"]


def filter_revisions(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One group per resource id, as CloudKitty's ``filter_unnecessary_measurements`` makes it."""
    if not groups or "id" not in groups[0]["group"]:
        return groups
    ordered = sorted(groups, key=lambda g: (str(g["group"]["id"]), str(g["group"].get("revision_start") or "")))
    kept = {g["group"]["id"]: copy.deepcopy(g) for g in ordered}
    for group in kept.values():
        if len(_aggregated(group)) == 1:
            when, granularity, _ = _aggregated(group)[0]
            _aggregated(group)[0] = [when, granularity, 0.0]
    for group in groups:
        if len(_aggregated(group)) == 1:
            _aggregated(kept[group["group"]["id"]])[0][2] += _aggregated(group)[0][2]
    return list(kept.values())
