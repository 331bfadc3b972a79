"""``hashmap service|field|group|mapping|threshold create|list|show|update|delete``: one rule at a time.

The commands and options are those of CloudKitty's client (``openstack rating hashmap ...``):
objects are named by their uuid (services and groups by their name too), ``mapping create`` takes
``--service-id`` or ``--field-id``, ``--value``, the cost (``--cost`` or positional), ``-t/--type``,
``-g/--group-id`` and ``-p/--project-id`` (alias ``--tenant-id``); ``group delete --recursive``
deletes the group's rules too.  The validations are CloudKitty's (``connectors.sql.hashmap_admin``);
a refused request prints one line naming the option and the value and exits 2.  Output is a table,
or ``--format json|csv|value`` (``json``: one object for one rule — show, create, update — and a list
for a listing; ``value``: the bare values, one row per line, as cliff prints them;
``--column`` picks columns, e.g. ``--format value --column mapping_id``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ratebeam.pipelines.commands.common import engine_of, load, parse_instant
from ratebeam.pipelines.commands.output import FORMATS, VALUE, add_format_argument, write_json, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_OK

#: The columns each kind shows (CloudKitty's client columns; names beside the ids, and the window).
COLUMNS = {
    "service": ["service_id", "name"],
    "field": ["field_id", "name", "service_id", "service"],
    "group": ["group_id", "name"],
    "mapping": ["mapping_id", "service", "field", "value", "cost", "type", "group", "tenant_id", "start", "end",
                "service_id", "field_id", "group_id", "name", "description", "created_at", "created_by",
                "updated_by", "deleted", "deleted_by"],
    "threshold": ["threshold_id", "service", "field", "level", "cost", "type", "group", "tenant_id",
                  "service_id", "field_id", "group_id"],
}
#: The narrower default of a table (the parents' uuids are in the other formats and in ``show``).
TABLE_COLUMNS = {
    "mapping": COLUMNS["mapping"][:10],
    "threshold": COLUMNS["threshold"][:8],
}


def add_arguments(sub: argparse._SubParsersAction, config: Callable[[argparse.ArgumentParser], Any]) -> None:
    """Register ``ratebeam hashmap ...``; ``config`` adds ``-c/--config`` to a parser."""
    kinds = sub.add_parser("hashmap", help="hashmap rules one at a time, as CloudKitty's client "
                           "(openstack rating hashmap ...)").add_subparsers(dest="hashmap_kind", required=True)
    for kind in ("service", "field", "group"):
        _named_kind(kinds, kind, config)
    for kind in ("mapping", "threshold"):
        _rule_kind(kinds, kind, config)


def _action(actions: argparse._SubParsersAction, name: str, kind: str,
            func: Callable[[Any, argparse.Namespace], Any], help: str,
            config: Callable[[argparse.ArgumentParser], Any], *, output: bool = True) -> argparse.ArgumentParser:
    """One action's parser; ``func(engine, args)`` does it (``output``: it returns rows to print)."""
    parser = actions.add_parser(name, help=help)
    parser.set_defaults(func=lambda args: _run(args, kind, func, output))
    config(parser)
    if output:
        add_format_argument(parser, (*FORMATS, VALUE))
        parser.add_argument("--column", action="append", default=[], metavar="NAME",
                            help=f"show only this column (repeatable; of {', '.join(COLUMNS[kind])})")
    return parser


def _named_kind(kinds: argparse._SubParsersAction, kind: str, config: Callable) -> None:
    """Services, fields and groups: a name (fields: within a service)."""
    actions = kinds.add_parser(kind, help=f"hashmap {kind}s").add_subparsers(dest="hashmap_action", required=True)
    ref = {"service": "SERVICE", "field": "FIELD_ID", "group": "GROUP"}[kind]
    what = "uuid or name" if kind != "field" else "uuid"
    create = _admin(f"create_{kind}")
    if kind == "field":
        p = _action(actions, "create", kind, lambda e, a: create(e, a.service, a.name), "create a field of a service",
                    config)
        p.add_argument("service", metavar="SERVICE", help="the service (uuid or name)")
        p = _action(actions, "list", kind, lambda e, a: _admin("list_fields")(e, a.service), "the fields", config)
        p.add_argument("service", metavar="SERVICE", nargs="?", help="only this service's (uuid or name)")
    else:
        p = _action(actions, "create", kind, lambda e, a: create(e, a.name), f"create a {kind}", config)
        _action(actions, "list", kind, lambda e, a: _admin(f"list_{kind}s")(e), f"every {kind}", config)
    p = actions.choices["create"]
    p.add_argument("name", help=f"the {kind}'s name" + (" (the metric type it rates)" if kind == "service" else ""))
    p = _action(actions, "show", kind, lambda e, a: _admin(f"get_{kind}")(e, a.ref), f"one {kind}", config)
    p.add_argument("ref", metavar=ref, help=f"the {kind} ({what})")
    p = _action(actions, "update", kind, lambda e, a: _admin(f"update_{kind}")(e, a.ref, a.name),
                f"rename a {kind}", config)
    p.add_argument("ref", metavar=ref, help=f"the {kind} ({what})")
    p.add_argument("--name", required=True, help="the new name")
    if kind == "group":
        p = _action(actions, "delete", kind, lambda e, a: _admin("delete_group")(e, a.ref, recursive=a.recursive),
                    "delete a group (its rules become ungrouped)", config, output=False)
        p.add_argument("--recursive", action="store_true", help="delete the group's mappings and thresholds too")
    else:
        cascade = "fields, mappings and thresholds" if kind == "service" else "mappings and thresholds"
        p = _action(actions, "delete", kind, lambda e, a: _admin(f"delete_{kind}")(e, a.ref),
                    f"delete a {kind} with its {cascade}", config, output=False)
    p.add_argument("ref", metavar=ref, help=f"the {kind} ({what})")


def _rule_kind(kinds: argparse._SubParsersAction, kind: str, config: Callable) -> None:
    """Mappings and thresholds: a parent, a cost, a type, a group and a tenant."""
    actions = kinds.add_parser(kind, help=f"hashmap {kind}s").add_subparsers(dest="hashmap_action", required=True)
    ref = f"{kind.upper()}_ID"
    p = _action(actions, "create", kind, lambda e, a: _create_rule(e, a, kind), f"create a {kind}", config)
    _parent_options(p, "the parent")
    if kind == "threshold":
        p.add_argument("level_arg", nargs="?", metavar="LEVEL", help="the level (or --level)")
        p.add_argument("--level", help="the level the qty (service) or the field's value reaches (default 0)")
    p.add_argument("cost_arg", nargs="?", metavar="COST", help="the cost, an exact decimal (or --cost)")
    p.add_argument("--cost", help="the cost, an exact decimal")
    p.add_argument("-t", "--type", choices=("flat", "rate"), default="flat",
                   help="flat: a price per point; rate: a factor of qty (default: flat, as CloudKitty's API)")
    _rule_options(p, kind, create=True)

    p = _action(actions, "list", kind, lambda e, a: _list_rules(e, a, kind), f"the {kind}s", config)
    _parent_options(p, "only this parent's")
    p.add_argument("-g", "--group-id", dest="group", help="only this group's (uuid or name)")
    p.add_argument("-p", "--project-id", "--tenant-id", dest="tenant_id", help="only this tenant's")
    p.add_argument("--filter-tenant", action="store_true", help="filter on --project-id even when absent "
                   "(then: global rules only)")
    p.add_argument("--no-group", action="store_true", help=f"only ungrouped {kind}s")
    if kind == "mapping":
        p.add_argument("--deleted", action="store_true", help="include soft-deleted mappings")

    p = _action(actions, "show", kind, lambda e, a: _admin(f"get_{kind}")(e, a.ref), f"one {kind}", config)
    p.add_argument("ref", metavar=ref, help=f"the {kind}'s uuid")
    p = _action(actions, "update", kind, lambda e, a: _update_rule(e, a, kind), f"change a {kind}", config)
    p.add_argument("ref", metavar=ref, help=f"the {kind}'s uuid")
    if kind == "threshold":
        p.add_argument("--level", help="the new level")
    p.add_argument("--cost", help="the new cost")
    p.add_argument("-t", "--type", choices=("flat", "rate"), help="the new type")
    _rule_options(p, kind, create=False)
    verb = "soft-delete (CloudKitty keeps deleted mappings)" if kind == "mapping" else "delete"
    p = _action(actions, "delete", kind, lambda e, a: _admin(f"delete_{kind}")(e, a.ref),
                f"{verb} a {kind}", config, output=False)
    p.add_argument("ref", metavar=ref, help=f"the {kind}'s uuid")


def _parent_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("-s", "--service-id", dest="service", help=f"{what} service (uuid or name)")
    parser.add_argument("--field-id", dest="field", help=f"{what} field (uuid)")


def _rule_options(parser: argparse.ArgumentParser, kind: str, *, create: bool) -> None:
    new = "" if create else "the new "
    parser.add_argument("-g", "--group-id", dest="group", help=f"{new}group (uuid or name; default: ungrouped)"
                        if create else "the new group (uuid or name)")
    parser.add_argument("-p", "--project-id", "--tenant-id", dest="tenant_id",
                        help=f"{new}tenant (scope) the rule applies to" + (" (default: every tenant)" if create else ""))
    if kind != "mapping":
        return
    parser.add_argument("--value", help=f"{new}field value matched (field mappings only)")
    parser.add_argument("--start", help=f"{new}start of validity, ISO-8601" + (" (default: 1970-01-01, as in a "
                        "rules file; CloudKitty's API defaults to now)" if create else ""))
    parser.add_argument("--end", help=f"{new}end of validity, excluded, ISO-8601" + (" (default: open)" if create else ""))
    parser.add_argument("--description", help=f"{new}description")
    if create:
        parser.add_argument("--name", help="a unique name of at most 32 characters (default: a generated one)")
    else:
        parser.add_argument("--force", action="store_true", help="change a mapping that has started (CloudKitty "
                            "allows only its end); re-rate the changed periods with `state reset`")


def _create_rule(engine: Any, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    from ratebeam.connectors.sql import hashmap_rule_admin as admin

    options = {"cost": _one_of(args, "cost"), "type": args.type, "service": args.service, "field": args.field,
               "group": args.group, "tenant_id": args.tenant_id}
    if kind == "threshold":
        level = _one_of(args, "level", required=False)
        return admin.create_threshold(engine, **options, **({} if level is None else {"level": level}))
    return admin.create_mapping(engine, **options, value=args.value, start=_instant(args.start, "--start"),
                                end=_instant(args.end, "--end"), name=args.name, description=args.description)


def _list_rules(engine: Any, args: argparse.Namespace, kind: str) -> list[dict[str, Any]]:
    from ratebeam.connectors.sql import hashmap_rule_admin as admin

    tenant = args.tenant_id if args.tenant_id is not None or args.filter_tenant else admin.ANY
    options = {"service": args.service, "field": args.field, "group": args.group, "no_group": args.no_group,
               "tenant_id": tenant}
    if kind == "mapping":
        return admin.list_mappings(engine, **options, deleted=args.deleted)
    return admin.list_thresholds(engine, **options)


def _update_rule(engine: Any, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    from ratebeam.connectors.sql import hashmap_rule_admin as admin

    allowed = admin.MAPPING_CHANGES if kind == "mapping" else admin.THRESHOLD_CHANGES
    changes = {key: getattr(args, key) for key in allowed if getattr(args, key, None) is not None}
    for key in ("start", "end"):
        if key in changes:
            changes[key] = _instant(changes[key], f"--{key}")
    if kind == "mapping":
        return admin.update_mapping(engine, args.ref, changes, force=args.force)
    return admin.update_threshold(engine, args.ref, changes)


def _one_of(args: argparse.Namespace, name: str, *, required: bool = True) -> str | None:
    """``--NAME`` or the positional NAME (CloudKitty's client takes it positionally), not both."""
    option, positional = getattr(args, name), getattr(args, f"{name}_arg")
    if option is not None and positional is not None:
        raise InputError("command line", f"--{name}", f"given twice (positional {positional!r})", option)
    if option is None and positional is None and required:
        raise InputError("command line", f"--{name}", "required (or give it positionally)")
    return option if option is not None else positional


def _instant(text: str | None, what: str) -> Any:
    return parse_instant(text, what) if text else None


def _run(args: argparse.Namespace, kind: str, func: Callable[[Any, argparse.Namespace], Any], output: bool) -> int:
    """Run one action; a ``RuleError`` becomes the ``InputError`` naming the option and the value."""
    from ratebeam.connectors.sql.hashmap_admin import RuleError

    engine = engine_of(load(args, metrics=False))
    try:
        result = func(engine, args)
    except RuleError as err:
        option = f"--{err.key.replace('_', '-')}"
        if err.has_value:
            raise InputError("command line", option, err.message, err.value) from None
        raise InputError("command line", option, err.message) from None
    finally:
        engine.dispose()
    if not output:
        print(f"deleted {kind} {result[f'{kind}_id']}")
        return EXIT_OK
    columns = _columns(args.column, kind, args.format)
    if not isinstance(result, list) and args.format == "json":  # one object (show, create, update), as cliff's
        write_json({c: result.get(c) for c in columns})
        return EXIT_OK
    rows = result if isinstance(result, list) else [result]
    write_rows([{k: v for k, v in row.items() if k != "raw"} for row in rows], columns, args.format)
    return EXIT_OK


def _columns(chosen: list[str], kind: str, fmt: str) -> list[str]:
    for name in chosen:
        if name not in COLUMNS[kind]:
            raise InputError("command line", "--column", f"unknown column (known: {', '.join(COLUMNS[kind])})", name)
    if chosen:
        return chosen
    return TABLE_COLUMNS.get(kind, COLUMNS[kind]) if fmt == "table" else COLUMNS[kind]


def _admin(name: str) -> Callable[..., Any]:
    """``connectors.sql.hashmap_admin``'s or ``hashmap_rule_admin``'s function ``name``, imported when called.

    Building the parser must not import SQLAlchemy (``ratebeam --help`` starts fast).
    """
    def call(*args: Any, **kwargs: Any) -> Any:
        from ratebeam.connectors.sql import hashmap_admin, hashmap_rule_admin

        module = hashmap_rule_admin if hasattr(hashmap_rule_admin, name) else hashmap_admin
        return getattr(module, name)(*args, **kwargs)

    return call
