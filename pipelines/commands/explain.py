"""``report explain``: which rules priced a stored point, and the arithmetic that gave its price.

The points of one scope, type and period are read back from the storage backend; the rules come
from the database as they are now and are applied as at the period's begin (validity windows,
tenant rules), through the kernel's own tracing (``transforms.explain``).  Where the backend keeps
lineage (``StorageCapabilities.stores_lineage``) the ids stored at rating time are printed beside
the re-derived ones, and a difference (rules changed since) is flagged; elsewhere the output says
the lineage is re-derived.  ``rate --explain`` prints the same for a usage file
(``pipelines.rate_command``).  Exit status: 0, or 3 when a point's frame fails (a field CloudKitty
cannot compare), 2 when the backend holds no such point (the input names nothing stored).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, TextIO

from ratebeam.pipelines.commands.common import engine_of, load, parse_instant
from ratebeam.pipelines.commands.grammar import add_time_range, spelled
from ratebeam.pipelines.commands.output import add_format_argument, write_json, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_FRAME_FAILED, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.transforms.explain import PointExplanation

#: Points read for one (scope, type, period): far more than any real period holds.
_MAX_POINTS = 100_000


def add_arguments(report: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``report explain`` under the ``report`` group (``command`` is cli's sub-command factory)."""
    from ratebeam.pipelines.commands.report import add_backend_argument

    p = command(report, "explain", cmd_report_explain,
                "per stored point: each group's flat, rates and threshold (with their ids) and the arithmetic")
    p.add_argument("--scope", required=True, help="the scope id")
    p.add_argument("--type", required=True, help="the metric type")
    add_time_range(p, from_help="the period's begin (ISO-8601; required)",
                   to_help="the period's end, excluded (ISO-8601; default: begin + the collect period)")
    add_format_argument(p)
    add_backend_argument(p)


def cmd_report_explain(args: argparse.Namespace) -> int:
    """Explain the stored points of ``--scope``, ``--type`` and the period beginning at ``--begin``."""
    from ratebeam.connectors.sql.rules_repository import load_rules
    from ratebeam.connectors.storage.base import FilterValue
    from ratebeam.pipelines.commands.report import reading_backend
    from ratebeam.transforms.explain import explain
    from ratebeam.transforms.frames import to_frame
    from ratebeam.transforms.schema import SCOPE, TYPE

    config = load(args, metrics=False)
    if args.begin is None:
        raise InputError("command line", "--from", "required: the period's begin")
    begin = parse_instant(args.begin, spelled(args, "begin"))
    end = parse_instant(args.end, spelled(args, "end")) if args.end else begin + timedelta(seconds=config.period)
    engine = engine_of(config)
    try:
        rules = load_rules(engine)
    finally:
        engine.dispose()
    backend = reading_backend(config, args.backend)
    try:
        backend.check_readable()
        filters: dict[str, FilterValue] = {SCOPE: args.scope, TYPE: args.type}
        points = backend.retrieve(begin=begin, end=end, filters=filters, limit=_MAX_POINTS).points
    finally:
        backend.close()
    if not points.num_rows:  # the input names nothing stored: refused input, as `failures show NOSUCH`
        raise InputError("command line", "--scope/--type/--from", f"no stored point in [{begin.isoformat()}, "
                         f"{end.isoformat()}) ({backend.capabilities.name} storage)", f"{args.scope} {args.type}")
    exact = backend.capabilities.exact_decimals
    return write_explanations(explain(to_frame(points), rules, stored=True, exact=exact), args.format)


def write_explanations(explanations: list[PointExplanation], fmt: str, out: TextIO | None = None) -> int:
    """Print the explanations; the exit status they give.

    ``table``: lines of text, ``json``: a list, ``csv``: a row per point, its nested parts as JSON text.
    """
    import json
    import sys

    from ratebeam.transforms.explain import to_json, to_text

    out = sys.stdout if out is None else out
    if fmt == "json":
        write_json([to_json(e) for e in explanations], out)
    elif fmt == "csv":
        rows = [{k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in to_json(e).items()}
                for e in explanations]
        write_rows(rows, list(dict.fromkeys(k for row in rows for k in row)), "csv", out)
    else:
        for e in explanations:
            out.write("\n".join(to_text(e)) + "\n")
    return EXIT_FRAME_FAILED if any(e.failed_field is not None for e in explanations) else EXIT_OK
