"""Where the Parquet storage keeps a slice: ``<root>/type=<type>/scope=<scope>/<begin stamp>.parquet``.

The path alone says a file's type, scope and period begin, so queries prune by listing
directories instead of opening files; these helpers make and compare those path parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One stored slice, as its path says: no need to open it to know its keys."""

    path: str
    type: str
    scope: str
    #: period begin as ``%Y%m%dT%H%M%SZ``: sorts like the time.
    stamp: str



_SECOND = timedelta(seconds=1)


def quote_segment(value: str) -> str:
    """A path segment for ``value``: every byte but ``[A-Za-z0-9_.~-]`` percent-encoded."""
    return quote(value, safe="")


def stamp(moment: datetime) -> str:
    """``%Y%m%dT%H%M%SZ`` in UTC, zero-padded so that stamps sort like times."""
    t = moment.astimezone(UTC)
    return f"{t.year:04d}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}Z"


def ceil_second(moment: datetime) -> datetime:
    """The first whole second at or after ``moment``: ``file begin < moment`` iff ``stamp < stamp(this)``."""
    return moment if not moment.microsecond else moment.replace(microsecond=0) + _SECOND
