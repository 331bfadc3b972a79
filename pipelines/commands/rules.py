"""``db``, ``rules``, ``modules`` and ``scripts``: the schema and the rating setup in the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import CommandError, bounded, engine_of, load, parse_instant
from ratebeam.pipelines.commands.output import write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from sqlalchemy import Engine

#: A module priority is a 32-bit INTEGER column (CloudKitty's schema, on PostgreSQL too).
PRIORITY_LIMIT = 2**31


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Create or migrate the schema."""
    from ratebeam.connectors.sql.migrations import upgrade

    applied = upgrade(engine_of(load(args, metrics=False), check=False))
    for step in applied:
        print(f"applied migration {step}")
    if not applied:
        print("schema is up to date")
    return EXIT_OK


def cmd_rules_import(args: argparse.Namespace) -> int:
    """Replace every hashmap rule with the rules file, or ``--merge`` it in; unchanged rules keep their ids.

    The file is validated first (its groups declared or existing); a merged rule set is validated
    again as a whole, since the file's rules may clash with the database's.
    """
    import json

    from ratebeam.connectors.sql import rules_repository as repo
    from ratebeam.connectors.sql.rules_import import merge_rules
    from ratebeam.pipelines import interchange

    engine = engine_of(load(args, metrics=False))
    existing = repo.load_rules(engine)
    rules = interchange.read_rules(args.file, known_groups=existing.groups)
    if args.merge:
        merged = merge_rules(existing, rules)
        text = json.dumps(interchange.rules_to_json(merged))
        repo.replace_rules(engine, interchange.parse_rules(text, f"{args.file} merged into the database's rules"))
    else:
        repo.replace_rules(engine, rules)
    enable_hashmap_if_unset(engine)
    print(f"{'merged' if args.merge else 'imported'} {len(rules.services)} service(s), {len(rules.fields)} field(s), "
          f"{len(rules.mappings)} mapping(s), {len(rules.thresholds)} threshold(s) from {args.file}")
    return EXIT_OK


def cmd_rules_export(args: argparse.Namespace) -> int:
    """The hashmap rules as a rules file (``-``: stdout)."""
    from ratebeam.connectors.sql import rules_repository as repo
    from ratebeam.pipelines import interchange

    rules = repo.load_rules(engine_of(load(args, metrics=False)))
    if args.file == "-":
        interchange.write_rules(rules, sys.stdout)
        return EXIT_OK
    try:
        with open(args.file, "w", encoding="utf-8") as out:
            interchange.write_rules(rules, out)
    except OSError as exc:  # a missing directory, a directory, no permission
        raise InputError(args.file, "", f"cannot write: {exc.strerror or exc}") from None
    return EXIT_OK


def cmd_rules_list(args: argparse.Namespace) -> int:
    """One table row per mapping and threshold."""
    from ratebeam.connectors.sql import rules_repository as repo

    rules = repo.load_rules(engine_of(load(args, metrics=False)))
    rows = [
        {"service": m.service, "field": m.field or "", "value": m.value or "", "kind": "mapping",
         "type": m.type, "cost": m.cost, "group": m.group or "", "tenant": m.tenant_id or "",
         "start": m.start, "end": m.end}
        for m in rules.mappings
    ] + [
        {"service": t.service, "field": t.field or "", "value": f">= {t.level}", "kind": "threshold",
         "type": t.type, "cost": t.cost, "group": t.group or "", "tenant": t.tenant_id or ""}
        for t in rules.thresholds
    ]
    write_rows(rows, ["service", "field", "value", "kind", "type", "cost", "group", "tenant", "start", "end"],
               args.format)
    return EXIT_OK


def enable_hashmap_if_unset(engine: Engine) -> None:
    """A CloudKitty module without a state row is disabled; importing rules means wanting them used."""
    import sqlalchemy as sa

    from ratebeam.connectors.sql.models import ModuleState
    from ratebeam.connectors.sql.rules_repository import set_module_state

    with engine.connect() as conn:
        exists = conn.execute(sa.select(ModuleState.name).where(ModuleState.name == "hashmap")).first()
    if exists is None:
        set_module_state(engine, "hashmap", enabled=True)
        print("enabled the hashmap rating module (it had no state row)")


def cmd_modules_list(args: argparse.Namespace) -> int:
    """Each rating module's state and priority."""
    from ratebeam.connectors.sql.rules_repository import module_states
    from ratebeam.pipelines.rating import MODULE_NAMES

    states = module_states(engine_of(load(args, metrics=False)), MODULE_NAMES)
    write_rows([{"module": m.name, "enabled": m.enabled, "priority": m.priority} for m in states.values()],
               ["module", "enabled", "priority"], args.format)
    return EXIT_OK


def cmd_modules_toggle(args: argparse.Namespace) -> int:
    """``modules enable|disable MODULE``."""
    from ratebeam.connectors.sql.rules_repository import set_module_state

    set_module_state(engine_of(load(args, metrics=False)), args.module, enabled=args.enable)
    print(f"module {args.module}: {'enabled' if args.enable else 'disabled'}")
    return EXIT_OK


def cmd_modules_priority(args: argparse.Namespace) -> int:
    """``modules priority MODULE N`` (higher runs first)."""
    from ratebeam.connectors.sql.rules_repository import set_module_state

    priority = bounded(args.priority, "priority", -PRIORITY_LIMIT, PRIORITY_LIMIT - 1)
    set_module_state(engine_of(load(args, metrics=False)), args.module, priority=priority)
    print(f"module {args.module}: priority {args.priority}")
    return EXIT_OK


def cmd_scripts_add(args: argparse.Namespace) -> int:
    """Add or replace a script from a JSON file, checked before it is stored."""
    from ratebeam.connectors.sql import rules_repository as repo
    from ratebeam.transforms.scripted import ScriptError, load_script

    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(args.file, "", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(args.file, f"byte {exc.start}", "not UTF-8 text") from None
    try:
        script = load_script(text)
    except ScriptError as exc:
        raise InputError(args.file, exc.location, exc.message) from None
    start = parse_instant(args.start, "--start") if args.start is not None else None
    end = parse_instant(args.end, "--end") if args.end is not None else None
    try:
        start = repo.save_script(engine_of(load(args, metrics=False)), script.name, text, start=start, end=end)
    except ValueError as exc:  # the window is empty
        raise InputError("command line", "--end", str(exc)) from None
    print(f"script {script.name!r} saved ({len(script.steps)} step(s)), valid from {start.isoformat()}")
    return EXIT_OK


def cmd_scripts_delete(args: argparse.Namespace) -> int:
    """Delete a script by name; 2 when there is none."""
    from ratebeam.connectors.sql import rules_repository as repo

    if not repo.delete_script(engine_of(load(args, metrics=False)), args.name):
        raise CommandError(f"no script named {args.name!r}", EXIT_BAD_INPUT)
    print(f"script {args.name!r} deleted")
    return EXIT_OK


def cmd_scripts_list(args: argparse.Namespace) -> int:
    """The stored scripts and their validity."""
    from ratebeam.connectors.sql import rules_repository as repo

    scripts = repo.load_scripts(engine_of(load(args, metrics=False)))
    write_rows([{"name": s.name, "start": s.start, "end": s.end} for s in scripts], ["name", "start", "end"],
               args.format)
    return EXIT_OK
