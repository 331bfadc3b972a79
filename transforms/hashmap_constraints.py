"""CloudKitty's uniqueness rules of hashmap mappings and thresholds, written once.

Both ways rules get stored ask here — one rule at a time (``hashmap mapping|threshold create|update``)
and a whole rules file (``rules import``) — so whatever the first stores, the second takes back
unchanged: a backup (``rules export``) can always be restored.

The rules are CloudKitty 25.0.0's own, order included:

* a new mapping is refused when a non-deleted mapping with the same parent, value, tenant and group
  exists whose validity CloudKitty's date filter finds overlapping
  (``cloudkitty/rating/hash/db/sqlalchemy/api.py:341-405``, ``create_mapping``): with an end, the
  existing one starts before the new end and ends at or after the new start (or never); without an
  end, the existing one starts after the new start or never ends.  The filter is not symmetric, so
  it holds between each mapping and the ones stored *before* it — the order of the database's ids,
  the order of a rules file;
* an end before the start is refused, an end equal to it is not
  (``cloudkitty/rating/common/validations/fields.py:73-87``);
* thresholds have database unique constraints (level, field_id, tenant_id) and
  (level, service_id, tenant_id) (``cloudkitty/rating/hash/db/sqlalchemy/models.py:283-297``):
  one level per parent and tenant whatever the group, and — SQL's NULLs never being equal — any
  number of global (tenant-less) thresholds at one level.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from ratebeam.transforms.rules import ALWAYS


def utc(moment: datetime | None) -> datetime | None:
    """An instant as aware UTC (a naive one, as SQLite gives them back, is UTC)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True)
class MappingSlot:
    """What CloudKitty's duplicate check reads of a mapping; ``name`` is how the caller names it."""

    parent: Hashable
    value: str | None
    tenant_id: str | None
    group: Hashable
    start: datetime | None
    end: datetime | None
    name: str = ""

    def window(self) -> tuple[datetime, datetime | None]:
        """(start, end) as aware UTC; no start is the epoch (how ratebeam stores an open start)."""
        return utc(self.start) or ALWAYS, utc(self.end)

    def key(self) -> tuple[Hashable, ...]:
        """Parent, value, tenant, group: the mappings that may clash share it."""
        return self.parent, self.value, self.tenant_id, self.group


def end_before_start(start: datetime | None, end: datetime | None) -> bool:
    """CloudKitty's ``end < start`` refusal (an end equal to the start is allowed)."""
    begin = utc(start) or ALWAYS
    finish = utc(end)
    return finish is not None and finish < begin


def refuses(new: MappingSlot, existing: MappingSlot) -> bool:
    """Whether CloudKitty refuses to create ``new`` while ``existing`` is stored (its date filter)."""
    if new.key() != existing.key():
        return False
    start, end = new.window()
    other_start, other_end = existing.window()
    if end is not None:
        return other_start < end and (other_end is None or other_end >= start)
    return other_start > start or other_end is None


def mapping_clash(slots: Sequence[MappingSlot], index: int) -> MappingSlot | None:
    """The first mapping ``slots[index]`` clashes with, ``slots`` in stored order; None when none.

    A mapping stored before it must not refuse it, and it must not refuse one stored after it.
    """
    mapping = slots[index]
    for position, other in enumerate(slots):
        if (position < index and refuses(mapping, other)) or (position > index and refuses(other, mapping)):
            return other
    return None


@dataclass(frozen=True)
class ThresholdSlot:
    """What the threshold unique constraints read; ``name`` is how the caller names it."""

    parent: Hashable
    level: Decimal
    tenant_id: str | None
    name: str = ""


def threshold_clash(slots: Sequence[ThresholdSlot], index: int) -> ThresholdSlot | None:
    """The first threshold with the same parent, level and (non-null) tenant as ``slots[index]``."""
    threshold = slots[index]
    if threshold.tenant_id is None:
        return None
    for position, other in enumerate(slots):
        if (position != index and other.tenant_id == threshold.tenant_id and other.parent == threshold.parent
                and other.level == threshold.level):
            return other
    return None
