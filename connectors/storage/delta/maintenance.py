"""Vacuum of a Delta table: superseded files, and what a killed writer left, once old enough.

A write first puts its data files, then commits the log entry naming them; a SIGKILL between the
two leaves data files no version references (and, on a local disk, a half-made commit file in
``_delta_log``).  delta-rs's full vacuum removes every unreferenced data file older than the
retention; the log's leftovers are removed here.  The retention (``retention_hours``) must outlast
any write in flight and any reader still on an older version: their files look unreferenced too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from deltalake import DeltaTable

#: Log entries and checkpoints delta-rs itself writes: anything else in ``_delta_log`` whose name
#: marks it temporary is a commit that never completed.
_TEMPORARY_MARKS = (".tmp", "#")


def vacuum(table: DeltaTable, url: str, retention_hours: int) -> int:
    """Remove unreferenced files older than ``retention_hours``; return how many were removed."""
    removed = table.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=True
    )
    cutoff = time.time() - retention_hours * 3600
    stale = [p for p in _log_leftovers(url) if p.stat().st_mtime <= cutoff]
    for path in stale:
        path.unlink(missing_ok=True)
    table.cleanup_metadata()  # log entries older than delta.logRetentionDuration, before a checkpoint
    return len(removed) + len(stale)


def debris(table: DeltaTable, url: str) -> list[str]:
    """Files a vacuum with no retention would remove: superseded, or left by a killed write.

    On a local disk these are listed from the disk itself (a file vacuumed already is not there);
    on an object store, delta-rs's dry run names them (tombstones the log still lists included).
    """
    if not _is_local(url):
        return sorted(table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True))
    root = Path(url.removeprefix("file://"))
    referenced = {Path(uri.removeprefix("file://")).resolve() for uri in table.file_uris()}
    on_disk = [p for p in root.rglob("*") if p.is_file() and "_delta_log" not in p.relative_to(root).parts]
    return sorted([*(str(p) for p in on_disk if p.resolve() not in referenced), *map(str, _log_leftovers(url))])


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _log_leftovers(url: str) -> list[Path]:
    """Temporary commit files in a local table's ``_delta_log`` (object stores put commits whole)."""
    if not _is_local(url):
        return []
    log = Path(url.removeprefix("file://")) / "_delta_log"
    try:
        names = os.listdir(log)
    except FileNotFoundError:
        return []
    return [log / n for n in names if any(mark in n for mark in _TEMPORARY_MARKS)]
