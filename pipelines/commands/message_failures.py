"""``events failures list|show|clear``: the messages the event stream could not read or convert.

The frame dead letters' commands (``ratebeam failures``) for the other kind of dead letter: one
row of ``ratebeam_message_dead_letters`` per message (keyed by the SHA-256 of its body, or of its
``message_id`` when the event definitions refused a notification the inbox holds), with how often
it came, when last, the reason and the body.  The id shown is the digest's first
:data:`ID_CHARS` characters; ``show`` and ``clear`` take any unique prefix of it.  ``clear`` asks
for ``--yes``: a dead letter is the only copy of a message that was acknowledged.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ratebeam.pipelines.commands.common import CommandError, load, parse_instant
from ratebeam.pipelines.commands.grammar import add_time_range, spelled
from ratebeam.pipelines.commands.output import add_format_argument, cell, write_json, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

#: Characters of the digest a listing shows as the dead letter's id.
ID_CHARS = 12
_COLUMNS = ["id", "message_id", "failures", "received_at", "reason"]
_REASON_WIDTH = 80


def add_arguments(events: argparse._SubParsersAction, command: Any) -> None:
    """Register ``events failures list|show|clear`` under ``events`` (``command`` makes a parser with ``-c``)."""
    group = events.add_parser("failures", help="messages the event stream could not read or convert (dead letters)")
    commands = group.add_subparsers(dest="message_failures_command", required=True)
    p = command(commands, "list", cmd_list, "the message dead letters, oldest first")
    add_time_range(p, from_help="only those last received at or after this ISO-8601 instant", to_help=None)
    add_format_argument(p)
    p = command(commands, "show", cmd_show, "one message dead letter with its whole reason and body")
    p.add_argument("id", help="its id (`events failures list`), or any unique prefix of it")
    add_format_argument(p)
    p = command(commands, "clear", cmd_clear, "delete message dead letters: by id, --from or --all (needs --yes)")
    p.add_argument("ids", nargs="*", metavar="ID", help="the dead letters to delete (ids or unique prefixes)")
    add_time_range(p, from_help="those last received at or after this ISO-8601 instant", to_help=None)
    p.add_argument("--all", action="store_true", help="every message dead letter")
    p.add_argument("--yes", action="store_true", help="really delete (without it: say what would be deleted)")


def _letters(args: argparse.Namespace, digests: Sequence[str] = ()) -> Sequence[Any]:
    from ratebeam.connectors.sql.dead_letters import message_dead_letters
    from ratebeam.pipelines.commands.common import engine_of

    since = parse_instant(args.begin, spelled(args, "begin")) if getattr(args, "begin", None) else None
    engine = engine_of(load(args, metrics=False))  # refuses a schema that is not up to date
    try:
        return message_dead_letters(engine, since=since, digests=digests)
    finally:
        engine.dispose()


def _row(letter: Any) -> dict[str, Any]:
    return {"id": letter.digest[:ID_CHARS], "digest": letter.digest, "message_id": letter.message_id,
            "failures": letter.failures, "received_at": letter.received_at, "reason": letter.reason, "body": letter.body}


def _ids(values: Sequence[str]) -> list[str]:
    """The ids as given, each a hexadecimal prefix (a digest is SHA-256 in hex)."""
    for value in values:
        if not value or any(c not in "0123456789abcdef" for c in value.lower()):
            raise InputError("command line", "ID", "not a dead letter id (hexadecimal, `events failures list`)", value)
    return [v.lower() for v in values]


def cmd_list(args: argparse.Namespace) -> int:
    """The message dead letters (``--from``, alias ``--since``), oldest first."""
    rows = [_row(letter) for letter in _letters(args)]
    if args.format == "table":
        for row in rows:
            reason = " ".join(row["reason"].split())
            row["reason"] = reason if len(reason) <= _REASON_WIDTH else reason[: _REASON_WIDTH - 3] + "..."
    write_rows(rows, _COLUMNS, args.format, footer=f"({len(rows)} message dead letter(s))")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    """One message dead letter, every field; an unknown or ambiguous id is an error."""
    [prefix] = _ids([args.id])
    found = _letters(args, [prefix])
    if len(found) != 1:
        why = "no message dead letter has this id" if not found else f"{len(found)} dead letters start with it"
        raise InputError("command line", "id", f"{why} (`ratebeam events failures list`)", args.id)
    row = _row(found[0])
    if args.format == "json":
        write_json(row)
        return EXIT_OK
    if args.format == "csv":
        write_rows([row], list(row), "csv")
        return EXIT_OK
    for key, value in row.items():
        if key not in ("reason", "body"):
            print(f"{key + ':':13} {cell(value)}")
    print(f"reason:\n  {row['reason']}\nbody:\n  {row['body']}")
    return EXIT_OK


def cmd_clear(args: argparse.Namespace) -> int:
    """Delete the message dead letters named by ids, ``--from`` or ``--all``; only with ``--yes``."""
    from ratebeam.connectors.sql.dead_letters import clear_message_dead_letters
    from ratebeam.pipelines.commands.common import engine_of

    if not (args.ids or args.begin or args.all):
        raise InputError("command line", "events failures clear", "name what to delete: ID..., --from or --all",
                         "nothing")
    if args.all and args.ids:
        raise InputError("command line", "--all", "give ids or --all, not both", " ".join(args.ids))
    prefixes = _ids(args.ids)
    matched = _letters(args, prefixes)
    for prefix in prefixes:
        count = sum(m.digest.startswith(prefix) for m in matched)
        if count != 1:
            why = "no such message dead letter" if not count else f"{count} dead letters start with it: give more of it"
            raise InputError("command line", "ID", f"{why} (nothing was deleted)", prefix)
    if not args.yes:
        raise CommandError(f"would delete {len(matched)} message dead letter(s); nothing was deleted: add --yes to "
                           "delete them", EXIT_BAD_INPUT)
    engine = engine_of(load(args, metrics=False))
    try:
        deleted = clear_message_dead_letters(engine, [m.digest for m in matched])
    finally:
        engine.dispose()
    print(f"deleted {deleted} message dead letter(s)")
    return EXIT_OK
