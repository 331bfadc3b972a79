"""``ratebeam gaps --from --to [--scope]``: the (scope, metric, period) cells with nothing billed, and why.

A cell is a gap when its period was

* ``failed``: its frame is in the dead-letter table, unresolved (the frame is all metrics of the
  scope for the period, so each metric of it is listed; ``failures show ID`` says why);
* ``not_rated``: after the scope's state (``last_processed_timestamp``), or the scope was never
  rated — not due yet, held back by ``wait_periods``, capped, or the scope is inactive;
* ``empty``: rated and committed, but the collector returned no point for a type the scope had
  in the period before (a drop: a source down, a label renamed).  A type the scope never had (a
  project without floating IPs) is no gap, nor one it stopped having before the period before.
  This comes from ``ratebeam_cell_points``, which each commit fills (revision 0004): periods
  committed by an older ratebeam have no record, so they are never reported as empty.
* ``not_read``: not a cell but a usage file the collector finds (today) and leaves, and why
  (``Collector.not_read``: a hidden file, an unknown extension); whatever usage it holds is unbilled.

The scopes are those with a state row (all of them, or ``--scope``; a named scope without state is
``not_rated`` throughout).  ``--kind`` keeps only some kinds of gap.  Exit status 1 when a gap is
listed, 0 when none (``exit_codes``), so a scheduler or a monitoring check can alert on it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from ratebeam.pipelines.commands.common import engine_of, load, parse_instant
from ratebeam.pipelines.commands.grammar import add_time_range
from ratebeam.pipelines.commands.output import add_format_argument, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_GAPS, EXIT_OK

_COLUMNS = ["scope", "type", "period", "gap", "detail"]
#: The kinds of gap, in the order the module's docstring explains them.
KINDS = ("failed", "not_rated", "empty", "not_read")
#: Cells a single ``gaps`` call may look at (scopes × metrics × periods): a window of years of
#: minutes would print millions of rows; ask for a narrower window or some scopes instead.
MAX_CELLS = 5_000_000


def add_arguments(sub: argparse._SubParsersAction, command: Any) -> None:
    """Register ``gaps`` (``command`` makes a sub-command parser with ``-c``)."""
    p = command(sub, "gaps", cmd_gaps, "cells (scope, metric, period) failed, not yet rated, or collected empty after "
                "a period with points; exit 1 when one is listed (for alerting), 0 when none")
    p.description = ("Cells (scope, metric, period) of the window that failed (dead letter), are not rated yet, "
                     "or were collected empty although the scope had the type the period before; usage files "
                     "not read.  Exit status: 0 no gap listed, 1 gaps listed (EXIT_GAPS: alert on it), "
                     "2 bad input.")
    add_time_range(p, from_help="first period (ISO-8601, on a period boundary; default: start of the current month)",
                   to_help="end of the window, excluded (ISO-8601, on a period boundary; default: the end of the "
                   "last period due now, wait_periods included)")
    p.add_argument("--scope", action="append", default=[], help="only this scope (repeatable; default: every scope "
                   "with a state)")
    p.add_argument("--kind", action="append", choices=KINDS, default=[],
                   help="only this kind of gap (repeatable; default: every kind)")
    add_format_argument(p)


def _window(args: argparse.Namespace, period: int, wait_periods: int) -> list[datetime]:
    from ratebeam.transforms.periods import month_start

    now = datetime.now(UTC)
    due = now - timedelta(seconds=now.timestamp() % period + wait_periods * period)
    first = min(month_start(now), due - timedelta(seconds=period))
    begin = parse_instant(args.begin, "--from") if args.begin is not None else first - timedelta(
        seconds=first.timestamp() % period)
    end = parse_instant(args.end, "--to") if args.end is not None else due
    for what, moment in (("--from", begin), ("--to", end)):
        if moment.timestamp() % period:
            raise InputError("command line", what, f"not on a period boundary (period: {period} s)", moment.isoformat())
    if begin >= end:
        raise InputError("command line", "--from", f"must be before --to ({end.isoformat()})", begin.isoformat())
    step = timedelta(seconds=period)
    return [begin + i * step for i in range(int((end - begin) / step))]


def cmd_gaps(args: argparse.Namespace) -> int:
    """List the gaps of the window; exit 1 when there is any."""
    from ratebeam.connectors.sql.cell_points import CellPointsStore
    from ratebeam.connectors.sql.dead_letters import DeadLetterFilter, DeadLetterStore
    from ratebeam.connectors.sql.state_store import StateStore

    config = load(args)
    assert config.metrics is not None  # loaded with metrics.yml
    periods = _window(args, config.period, config.wait_periods)
    types = config.metrics.rating_types
    engine = engine_of(config)
    try:
        states = {s.scope: s for s in StateStore(engine, config.scope_key, config.fetcher.backend,
                                                  config.collector.backend).list_states()}
        scopes = args.scope or sorted(states)
        if len(scopes) * len(types) * len(periods) > MAX_CELLS:
            raise InputError("command line", "--from", f"the window has more than {MAX_CELLS} cells: narrow it "
                             "or name scopes", args.begin)
        step = timedelta(seconds=config.period)
        begin, end = periods[0], periods[-1] + step
        points = {(c.scope, _utc(c.period_begin), c.type): c.points
                  for c in CellPointsStore(engine).find(begin - step, end, scopes)}
        empty = {(scope, period, type_) for (scope, period, type_), count in points.items()
                 if count == 0 and points.get((scope, period - step, type_), 0) > 0}
        dead = DeadLetterStore(config.database_url)
        try:
            failed = {(d.scope, d.period_begin): d for d in dead.find(DeadLetterFilter(scopes=tuple(scopes),
                                                                                       unresolved=True), begin, end)}
        finally:
            dead.engine.dispose()
    finally:
        engine.dispose()
    rows = []
    for scope in scopes:
        state = states.get(scope)
        for period in periods:
            gap, detail = _frame_gap(failed.get((scope, period)), state, period)
            for type_ in types:
                if gap is None and (scope, period, type_) in empty:
                    rows.append({"scope": scope, "type": type_, "period": period, "gap": "empty",
                                 "detail": "rated: the collector returned no point; the period before had "
                                 f"{points[(scope, period - step, type_)]}"})
                elif gap is not None:
                    rows.append({"scope": scope, "type": type_, "period": period, "gap": gap, "detail": detail})
    if not args.kind or "not_read" in args.kind:
        rows += [{"scope": None, "type": None, "period": None, "gap": "not_read", "detail": f"{path}: {why}"}
                 for path, why in _not_read(config)]
    if args.kind:
        rows = [row for row in rows if row["gap"] in args.kind]
    write_rows(rows, _COLUMNS, args.format)
    if args.format == "table":
        print(f"({len(rows)} gap(s) in {len(scopes)} scope(s) x {len(types)} metric(s) x {len(periods)} period(s))")
    return EXIT_GAPS if rows else EXIT_OK


def _utc(moment: datetime) -> datetime:
    """A period begin as stored (SQLite gives naive UTC back) made aware, to match the window's."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _not_read(config: Any) -> list[tuple[str, str]]:
    """The usage files the collector finds today and does not read (each a gap of unknown cells).

    A source ``gaps`` cannot list (a monitoring host without the usage files) is said, not fatal:
    the gaps of the database are still worth knowing.
    """
    from ratebeam.connectors.errors import ConnectorError
    from ratebeam.connectors.registry import make_collector

    collector = make_collector(config.collector, config.scope_key)
    try:
        return collector.not_read()
    except ConnectorError as exc:
        print(f"ratebeam gaps: warning: the collector's files not listed: {exc}", file=sys.stderr)
        return []
    finally:
        collector.close()


def _frame_gap(letter: Any, state: Any, period: datetime) -> tuple[str | None, str]:
    """The gap of a whole frame (all its metrics), or None when it was rated.

    Failed when ``letter`` (its unresolved dead letter) is set; not rated when after ``state``.
    """
    if letter is not None:
        return "failed", f"dead letter {letter.id} [{letter.stage}], {letter.failures} failure(s)"
    if state is None:
        return "not_rated", "the scope has no state: never rated"
    last = state.last_processed
    if last is None or period > last:
        where = "never rated" if last is None else f"state at {last.isoformat()}"
        return "not_rated", where + ("" if state.active else "; the scope is inactive")
    return None, ""
