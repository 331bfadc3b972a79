"""``storage info``: what each configured backend can do, read from its declared capabilities.

Capabilities are data (``StorageCapabilities``), so an operator sees before a reset or a
reprocessing whether deletes work, whether totals are exact and whether a rewritten period can be
seen missing for a moment — the same facts the commands decide from.
"""

from __future__ import annotations

import argparse

from ratebeam.pipelines.commands.common import load
from ratebeam.pipelines.commands.output import write_rows
from ratebeam.pipelines.exit_codes import EXIT_OK


def cmd_storage_info(args: argparse.Namespace) -> int:
    """One row per configured storage backend (the first one is what ``report`` reads)."""
    from ratebeam.connectors.registry import make_backend

    rows = []
    for index, section in enumerate(load(args, metrics=False).storage):
        backend = make_backend(section)  # built, never initialised: nothing is contacted or created
        c = backend.capabilities
        rows.append({
            "backend": f"{index}: {c.name}", "exact_decimals": c.exact_decimals, "delete": c.supports_delete,
            "custom_fields": c.supports_custom_fields, "rewrite": c.rewrite, "idempotence": c.idempotence,
            "lineage": c.stores_lineage,
        })
        backend.close()
    write_rows(rows, ["backend", "exact_decimals", "delete", "custom_fields", "rewrite", "idempotence", "lineage"],
               args.format)
    return EXIT_OK
