"""The hashmap rules as plain typed rows: what the SQL repository loads and the kernel consumes.

Kept free of SQL and of Polars so that the rules JSON reader, the SQL repository, the differential
test and the kernel all speak about the same objects.  Order matters in CloudKitty (fields in DB
order break threshold ties), so every collection here is a tuple in load order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

MapType = Literal["flat", "rate"]

#: The start CloudKitty's migration gives mappings without one; read as "valid since always".
ALWAYS = datetime(1970, 1, 1, tzinfo=UTC)

#: CloudKitty's implicit group for rules without a group (`cloudkitty/rating/hash/db/sqlalchemy/api.py:311-405`).
DEFAULT_GROUP = "_DEFAULT_"


@dataclass(frozen=True, slots=True)
class MappingRule:
    """A hashmap mapping: a service mapping when ``field`` is None, else a field mapping."""

    service: str
    field: str | None
    value: str | None
    type: MapType
    cost: Decimal
    group: str | None = None
    tenant_id: str | None = None
    start: datetime | None = None  # aware UTC; None = always valid from the past
    end: datetime | None = None  # aware UTC; None = open
    #: Where the rule comes from (CloudKitty's ``mapping_id``, or its place in a rules file): what
    #: lineage names.  Not part of equality: two rule sets pricing alike are equal (caches, diffs).
    id: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        # One form for "valid since always": files and CloudKitty databases say 1970-01-01.
        if self.start is not None and self.start.tzinfo is not None and self.start <= ALWAYS:
            object.__setattr__(self, "start", None)


@dataclass(frozen=True, slots=True)
class ThresholdRule:
    """A hashmap threshold on a service (compares qty) or on a field (compares the value)."""

    service: str
    field: str | None
    level: Decimal
    type: MapType
    cost: Decimal
    group: str | None = None
    tenant_id: str | None = None
    #: CloudKitty's ``threshold_id``, or the rule's place in a rules file (see ``MappingRule.id``).
    id: str | None = dataclasses.field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Every hashmap rule of a database or file, tenant rules and validity windows included.

    ``services`` and ``fields`` keep DB order (creation order): a field's position decides
    threshold ties.  Resolution to the rules that apply to one (scope, period begin) is the
    kernel's job, done in bulk for all frames of a batch.
    """

    services: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()  # (service, field)
    mappings: tuple[MappingRule, ...] = ()
    thresholds: tuple[ThresholdRule, ...] = ()
    groups: tuple[str, ...] = field(default=())

    def version_key(self) -> int:
        """A hash that changes whenever any rule changes: the key of per-worker caches."""
        return hash((self.services, self.fields, self.mappings, self.thresholds))

    def rule_ids(self) -> tuple[str | None, ...]:
        """Every rule's ``id`` in order: with equality, what tells apart rule sets whose lineage differs."""
        return tuple(m.id for m in self.mappings) + tuple(t.id for t in self.thresholds)
