"""``rules diff PROPOSED.json``: what a rule change would do to the money already rated, before making it.

The stored points of the range are read from the storage backend (no collector request), re-rated
with the database's rating setup and with the same setup whose hashmap rules are the proposed file,
and compared (``transforms.money_diff``): money per scope and type, and the (scope, period, type)
cells that change.  Nothing is written.  ``--apply`` then imports the rules as ``rules import``
does and creates one reprocessing schedule per run of contiguous changed periods of a scope, after
checking all of them as ``reprocess create`` does — so either both happen or neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import CommandError, engine_of, load, parse_instant
from ratebeam.pipelines.commands.grammar import add_time_range
from ratebeam.pipelines.commands.output import add_format_argument, cell, print_table, write_json, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    import polars as pl
    from sqlalchemy import Engine

    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.transforms.money_diff import MoneyDiff
    from ratebeam.transforms.rules import RuleSet

TOTAL_COLUMNS = ["scope_id", "type", "current", "proposed", "difference", "points"]
CELL_COLUMNS = ["scope_id", "begin", "type", "current", "proposed", "difference", "points"]
#: Failed frames listed on stderr (the count is always given).
_SHOWN_FAILURES = 10


def add_arguments(group: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``rules diff`` in the ``rules`` group (``command`` is cli's sub-command factory)."""
    from ratebeam.pipelines.commands.report import add_backend_argument

    p = command(group, "diff", cmd_rules_diff, "re-rate the stored points of a range with a proposed rules file "
                "and print the money difference (writes nothing; --apply imports it and schedules the re-rating)")
    p.add_argument("file", help="the proposed rules JSON file")
    add_time_range(p, from_help="first period (ISO-8601; default: start of the current month)",
                   to_help="end of the range, excluded (ISO-8601; default: start of next month)")
    p.add_argument("--scope", action="append", help="only this scope (repeatable; default: every stored scope)")
    p.add_argument("--cells", action="store_true", help="list the changed (scope, period, type) cells too "
                   "(csv: the cells instead of the totals; json always has both)")
    p.add_argument("--apply", action="store_true", help="import the rules and create reprocessing schedules for "
                   "exactly the changed cells")
    p.add_argument("--reason", help="reason stored with the schedules of --apply (default: names the file)")
    add_format_argument(p)
    add_backend_argument(p)


def cmd_rules_diff(args: argparse.Namespace) -> int:
    """Diff the proposed rules against the database's on the stored range; ``--apply`` it."""
    from ratebeam.connectors.storage.base import default_bounds
    from ratebeam.pipelines import interchange
    from ratebeam.pipelines.commands.reprocess import stores
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.transforms.metric_defs import MetricsConfig
    from ratebeam.transforms.money_diff import money_diff

    config = load(args, metrics=False)
    begin = parse_instant(args.begin, "--from") if args.begin is not None else None
    end = parse_instant(args.end, "--to") if args.end is not None else None
    begin, end = default_bounds(begin, end)
    if begin >= end:
        raise InputError("command line", "--to", f"must be after --from {begin.isoformat()}", end.isoformat())
    if args.reason is not None and not args.reason.strip():
        raise InputError("command line", "--reason", "must not be blank", repr(args.reason))
    engine = engine_of(config)
    current = load_rater(engine, MetricsConfig(metrics=()))  # stored points already passed the skip filter
    proposed = interchange.read_rules(args.file, known_groups=current.rules.groups)
    scopes = list(dict.fromkeys(args.scope or []))
    if scopes:
        known = {s.scope for s in stores(config)[0].list_states()}
        unknown = [s for s in scopes if s not in known]
        if unknown:
            raise InputError("command line", "--scope", "no such scope (it has no state: never rated)",
                             ", ".join(unknown))
    if not any(name == "hashmap" and enabled for name, enabled, _ in current.modules):
        print("ratebeam rules diff: warning: the hashmap module is disabled: no hashmap rule prices anything "
              "(`ratebeam modules enable hashmap`)", file=sys.stderr)
    stored = read_stored(config, args.backend, begin, end, scopes)
    diff = money_diff(stored, current(), dataclasses.replace(current, rules=proposed)())
    print_diff(diff, args.format, cells=args.cells)
    _warn_failures(diff)
    if args.apply:
        apply(config, engine, proposed, diff, args.reason.strip() if args.reason else f"rules diff --apply {args.file}")
    engine.dispose()
    return EXIT_OK


def read_stored(config: RatebeamConfig, backend_name: str | None, begin: datetime, end: datetime,
                scopes: list[str]) -> pl.DataFrame:
    """Every stored point of ``[begin, end]`` (of ``scopes``, or all) in one read of the backend."""
    from ratebeam.pipelines.commands.report import PAGE_LIMIT, reading_backend
    from ratebeam.transforms.frames import to_frame

    backend = reading_backend(config, backend_name)
    try:
        backend.check_readable()
        retrieved = backend.retrieve(begin=begin, end=end, filters={"scope_id": scopes} if scopes else None,
                                     limit=PAGE_LIMIT)
    finally:
        backend.close()
    return to_frame(retrieved.points)


def print_diff(diff: MoneyDiff, fmt: str, *, cells: bool) -> None:
    """The totals (and with ``cells`` the changed cells) in ``fmt``; JSON holds both sections."""
    totals, changed = diff.totals.to_dicts(), diff.cells.to_dicts()
    if fmt == "json":
        write_json({"totals": totals, "changed_cells": changed,
                    "failed_frames": {"current": len(diff.current_failures),
                                      "proposed": len(diff.proposed_failures)}})
        return
    if fmt == "csv":
        write_rows(changed if cells else totals, CELL_COLUMNS if cells else TOTAL_COLUMNS, fmt)
        return
    current = sum((row["current"] for row in totals), start=Decimal(0))
    proposed = sum((row["proposed"] for row in totals), start=Decimal(0))
    write_rows(totals, TOTAL_COLUMNS, fmt, footer=f"total: current {cell(current)}, proposed {cell(proposed)}, "
               f"difference {cell(proposed - current)}; {len(changed)} changed cell(s)" + ("" if cells or not changed else
                                                                         " (--cells lists them)"))
    if cells and changed:
        print()
        print_table(changed, CELL_COLUMNS)


def _warn_failures(diff: MoneyDiff) -> None:
    """Frames a side could not rate: their points count as no money on that side (stderr)."""
    for side, failures in (("current", diff.current_failures), ("proposed", diff.proposed_failures)):
        if failures:
            print(f"ratebeam rules diff: warning: the {side} rules fail {len(failures)} frame(s); their points "
                  f"count as 0 on that side", file=sys.stderr)
        for failure in failures[:_SHOWN_FAILURES]:
            print(f"  scope {failure.scope_id} period {failure.begin.isoformat()}: {failure.reason}", file=sys.stderr)


def changed_ranges(cells: pl.DataFrame, period: int) -> list[tuple[str, datetime, datetime]]:
    """The changed periods as (scope, first begin, last begin) runs of contiguous periods per scope."""
    step = timedelta(seconds=period)
    ranges: list[tuple[str, datetime, datetime]] = []
    for scope, begin in cells.select("scope_id", "begin").unique().sort("scope_id", "begin").iter_rows():
        if ranges and ranges[-1][0] == scope and ranges[-1][2] + step == begin:
            ranges[-1] = (scope, ranges[-1][1], begin)
        else:
            ranges.append((scope, begin, begin))
    return ranges


def apply(config: RatebeamConfig, engine: Engine, rules: RuleSet, diff: MoneyDiff, reason: str) -> None:
    """Import ``rules`` and schedule the changed cells, every schedule checked before anything changes."""
    from ratebeam.connectors.sql.rules_import import replace_rules
    from ratebeam.pipelines.commands.reprocess import check_schedules, check_window, stores
    from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset

    if diff.proposed_failures:
        raise CommandError(f"rules diff --apply: the proposed rules fail {len(diff.proposed_failures)} frame(s) "
                           "(listed above); nothing was imported or scheduled", EXIT_FAILED)
    ranges = changed_ranges(diff.cells, config.period)
    states, jobs = stores(config)
    for _, start, last in ranges:
        check_window(start, last, config.period, end_included=True)
    if ranges:
        check_schedules(states, jobs, ranges)
    replace_rules(engine, rules)
    enable_hashmap_if_unset(engine)
    print(f"imported the proposed rules ({len(rules.mappings)} mapping(s), {len(rules.thresholds)} threshold(s))",
          file=sys.stderr)
    if not ranges:
        print("no stored cell changes: nothing was scheduled", file=sys.stderr)
        return
    for scope, start, last in ranges:
        (schedule_id,) = jobs.add_schedules([scope], start, last, reason)
        print(f"schedule {schedule_id}: scope {scope}, {start.isoformat()} .. {last.isoformat()} (end included)",
              file=sys.stderr)
    print(f"{len(ranges)} schedule(s) created: `ratebeam reprocess run` (or the next `ratebeam run`) re-rates "
          f"them", file=sys.stderr)
