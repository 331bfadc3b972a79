"""``storage info`` (what each backend can do, what debris it holds) and ``storage compact``.

``storage compact`` merges small files and vacuums superseded ones and killed writers' debris,
where a backend can; ``storage info`` counts that debris.
Capabilities are data (``StorageCapabilities``), so an operator sees before a reset or a
reprocessing whether deletes work, whether totals are exact and whether a rewritten period can be
seen missing for a moment — the same facts the commands decide from.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ratebeam.pipelines.commands.common import bounded, integer, load
from ratebeam.pipelines.commands.output import add_format_argument, write_rows
from ratebeam.pipelines.exit_codes import EXIT_OK


def cmd_storage_info(args: argparse.Namespace) -> int:
    """One row per configured storage backend (the first one is what ``report`` reads)."""
    from ratebeam.connectors.registry import make_backend

    rows = []
    for index, section in enumerate(load(args, metrics=False).storage):
        backend = make_backend(section)  # built, never initialised: nothing is created
        c = backend.capabilities
        try:
            debris = backend.debris()  # the only thing read: the files under a file backend's root
        finally:
            backend.close()
        rows.append({
            "backend": f"{index}: {c.name}", "exact_decimals": c.exact_decimals, "delete": c.supports_delete,
            "custom_fields": c.supports_custom_fields, "rewrite": c.rewrite, "idempotence": c.idempotence,
            "lineage": c.stores_lineage, "debris": "-" if debris is None else len(debris),
        })
    write_rows(rows, ["backend", "exact_decimals", "delete", "custom_fields", "rewrite", "idempotence", "lineage",
                      "debris"], args.format)
    return EXIT_OK


def cmd_storage_compact(args: argparse.Namespace) -> int:
    """Compact every configured backend that supports it; one row of file counts per backend."""
    from ratebeam.connectors.registry import make_backend

    hours = None if args.retention_hours is None else bounded(args.retention_hours, "--retention-hours", 0, 87600)
    rows = []
    for index, section in enumerate(load(args, metrics=False).storage):
        backend = make_backend(section)
        try:
            if backend.capabilities.supports_compact:
                backend.check_readable()
                rows.append({"backend": f"{index}: {backend.capabilities.name}",
                             **backend.compact(hours)})
        finally:
            backend.close()
    if not rows:
        print("storage compact: no configured backend has files to compact (see `ratebeam storage info`)")
    else:
        write_rows(rows, ["backend", "files_before", "files_after", "vacuumed"], args.format)
    return EXIT_OK


def add_arguments(group: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``storage compact`` in the ``storage`` group (``command`` is the CLI's ``_command``)."""
    parser = command(group, "compact", cmd_storage_compact,
                     "merge small data files and vacuum superseded ones and crash leftovers (Delta and Parquet "
                     "backends)")
    parser.add_argument("--retention-hours", type=integer, default=None,
                        help="keep unreferenced files younger than this (default: the backend's retention_hours)")
    add_format_argument(parser)
