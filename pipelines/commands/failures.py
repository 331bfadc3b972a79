"""``failures list|show|clear``: the dead-letter table, outside the run that hit them.

A row is one frame (scope, period) that failed, with how often, when first and last, the last
stage and reason, and whether a later run rated it after all (``resolved``).  ``list`` shows the
unresolved ones unless ``--all``; ``clear`` deletes rows and asks for ``--yes`` first, since a
dead letter is the only record of why a period was late.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ratebeam.pipelines.commands.common import (
    CommandError,
    integer,
    json_default,
    load,
    parse_instant,
    row_ids,
)
from ratebeam.pipelines.commands.grammar import add_time_range, spelled
from ratebeam.pipelines.commands.output import add_format_argument, cell, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from sqlalchemy import Row

    from ratebeam.connectors.sql.dead_letters import DeadLetterFilter, DeadLetterStore

_COLUMNS = ["id", "scope", "period", "stage", "failures", "first_seen", "last_seen", "resolved_at", "reason"]
#: Characters of a reason a ``list`` table shows (``show`` prints it whole).
_REASON_WIDTH = 80


def add_arguments(sub: argparse._SubParsersAction, command: Any) -> None:
    """Register ``failures list|show|clear`` (``command`` makes a sub-command parser with ``-c``)."""
    group = sub.add_parser("failures", help="frames runs could not rate or store (the dead letters)")
    commands = group.add_subparsers(dest="failures_command", required=True)
    p = command(commands, "list", cmd_failures_list, "the dead letters, oldest period first (unresolved unless --all)")
    _add_filters(p)
    p.add_argument("--all", action="store_true", help="include the frames a later run rated (resolved)")
    add_format_argument(p)
    p = command(commands, "show", cmd_failures_show, "one dead letter with its whole reason")
    p.add_argument("id", type=integer, help="the dead letter's id (`failures list`)")
    add_format_argument(p)
    p = command(commands, "clear", cmd_failures_clear, "delete dead letters: by id, by scope or all (needs --yes)")
    p.add_argument("ids", type=integer, nargs="*", metavar="ID", help="the dead letters to delete")
    _add_filters(p)
    p.add_argument("--all", action="store_true", help="every dead letter (with --scope/--since: every matching one)")
    p.add_argument("--resolved", action="store_true", help="only those a later run rated after all")
    p.add_argument("--yes", action="store_true", help="really delete (without it: say what would be deleted)")


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scope", action="append", default=[], help="only this scope (repeatable)")
    add_time_range(parser, from_help="only those that last failed at or after this ISO-8601 instant", to_help=None)


def _store(args: argparse.Namespace) -> DeadLetterStore:
    from ratebeam.connectors.sql.dead_letters import DeadLetterStore
    from ratebeam.pipelines.commands.common import engine_of

    config = load(args, metrics=False)
    engine_of(config).dispose()  # refuses a schema that is not up to date, with the command that fixes it
    return DeadLetterStore(config.database_url)


def _filter(args: argparse.Namespace, *, unresolved: bool = False, resolved: bool = False) -> DeadLetterFilter:
    from ratebeam.connectors.sql.dead_letters import DeadLetterFilter

    since = parse_instant(args.begin, spelled(args, "begin")) if args.begin else None
    return DeadLetterFilter(scopes=tuple(args.scope), since=since, unresolved=unresolved, resolved=resolved,
                            ids=tuple(getattr(args, "ids", ())))


def _row(letter: Row[Any]) -> dict[str, Any]:
    return {"id": letter.id, "scope": letter.scope, "period": letter.period_begin, "stage": letter.stage,
            "failures": letter.failures, "first_seen": letter.created_at, "last_seen": letter.last_seen_at,
            "resolved_at": letter.resolved_at, "run_id": letter.run_id, "reason": letter.reason}


def cmd_failures_list(args: argparse.Namespace) -> int:
    """The dead letters matching ``--scope``/``--since``, unresolved only unless ``--all``.

    A table also says how many message dead letters the event stream has (``events failures``).
    """
    from ratebeam.connectors.sql.dead_letters import message_dead_letters

    store = _store(args)
    try:
        rows = [_row(letter) for letter in store.find(_filter(args, unresolved=not args.all))]
        messages = len(message_dead_letters(store.engine))
    finally:
        store.engine.dispose()
    if args.format == "table":
        for row in rows:
            reason = " ".join(row["reason"].split())
            row["reason"] = reason if len(reason) <= _REASON_WIDTH else reason[: _REASON_WIDTH - 3] + "..."
    write_rows(rows, _COLUMNS, args.format)
    if args.format == "table":
        print(f"({len(rows)} dead letter(s){'' if args.all else ', unresolved; --all adds the resolved ones'})")
        if messages:
            print(f"({messages} message dead letter(s) of the event stream: `ratebeam events failures list`)")
    return EXIT_OK


def cmd_failures_show(args: argparse.Namespace) -> int:
    """One dead letter, every field, the reason whole; an unknown id is an error."""
    from ratebeam.connectors.sql.dead_letters import DeadLetterFilter

    row_ids((args.id,), "id")
    store = _store(args)
    try:
        found = store.find(DeadLetterFilter(ids=(args.id,)))
    finally:
        store.engine.dispose()
    if not found:
        raise InputError("command line", "id", "no dead letter has this id (`ratebeam failures list --all`)", args.id)
    row = _row(found[0])
    if args.format == "json":
        json.dump(row, sys.stdout, default=json_default, indent=1)
        print()
        return EXIT_OK
    if args.format == "csv":
        write_rows([row], list(row), "csv")
        return EXIT_OK
    for key, value in row.items():
        if key != "reason":
            print(f"{key + ':':13} {cell(value)}")
    print(f"reason:\n  {row['reason']}")
    return EXIT_OK


def cmd_failures_clear(args: argparse.Namespace) -> int:
    """Delete the dead letters named by ids, ``--scope``/``--since`` or ``--all``; only with ``--yes``."""
    if not (args.ids or args.scope or args.begin or args.all or args.resolved):
        raise InputError("command line", "failures clear", "name what to delete: ID..., --scope, --from, "
                         "--resolved or --all", "nothing")
    row_ids(args.ids, "ID")
    if args.all and args.ids:
        raise InputError("command line", "--all", "give ids or --all, not both", " ".join(map(str, args.ids)))
    store = _store(args)
    selection = _filter(args, resolved=args.resolved)
    try:
        matched = store.find(selection)
        if args.ids:
            missing = sorted(set(args.ids) - {letter.id for letter in matched})
            if missing:
                raise InputError("command line", "ID", "no such dead letter (nothing was deleted)",
                                 " ".join(map(str, missing)))
        if not args.yes:
            raise CommandError(f"would delete {len(matched)} dead letter(s); nothing was deleted: add --yes to "
                               "delete them", EXIT_BAD_INPUT)
        deleted = store.clear(selection)
    finally:
        store.engine.dispose()
    print(f"deleted {deleted} dead letter(s)")
    return EXIT_OK
