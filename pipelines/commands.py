"""What each ``ratebeam`` sub-command does (the parser is in ``pipelines.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange import plain_decimal


class CommandError(Exception):
    """A command that ran but could not do what was asked (``status`` is the exit code)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def dispatch(args: argparse.Namespace) -> int:
    """Run the sub-command named in ``args``; connector errors become one-line messages."""
    from ratebeam.connectors.errors import ConnectorError, FatalConnectorError

    handler = {
        "run": cmd_run,
        "demo": cmd_demo,
        "rate": cmd_rate,
        "db": cmd_db,
        "rules": cmd_rules,
        "state": cmd_state,
        "modules": cmd_modules,
        "scripts": cmd_scripts,
        "report": cmd_report,
    }[args.command]
    try:
        return handler(args)
    except FatalConnectorError as exc:  # the run stopped: one line, exit status 2
        raise CommandError(exc.reason, status=2) from None
    except ConnectorError as exc:
        raise CommandError(str(exc)) from None


# ---- helpers ---------------------------------------------------------------------------------------


def parse_instant(text: str, what: str) -> datetime:
    """An ISO-8601 instant from the command line; naive means UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError("command line", what, "not an ISO-8601 date or time", text) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _config(args: argparse.Namespace):
    from ratebeam.pipelines.config import load_config

    return load_config(args.config)


def _engine(config, *, check: bool = True):
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.migrations import check_schema

    engine = make_engine(config.database_url)
    if check:
        check_schema(engine)
    return engine


def _filters(items: list[str]) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError("command line", "--filter", "expected KEY=VALUE", item)
        previous = out.get(key)
        if previous is None:
            out[key] = value
        else:
            out[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return plain_decimal(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def print_table(rows: list[dict[str, Any]], columns: list[str], out=None) -> None:
    """A plain aligned text table (numbers right-aligned)."""
    out = out or sys.stdout
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float, Decimal)) for r in rows) for c in columns]
    print("  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(columns, widths, numeric, strict=True)),
          file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print("  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(row, widths, numeric, strict=True)),
              file=out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return plain_decimal(value)
    return str(value)



# ---- run / demo / rate -----------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = _config(args)
    now = parse_instant(args.now, "--now") if args.now else datetime.now(UTC)
    extra = []
    if args.runner_config:
        from ratebeam.pipelines.runner_config import load_runner_config

        runner, extra = load_runner_config(args.runner_config)
    else:
        runner = "FnApiRunner"
    report = run_configured_cycle(config, now, runner, extra)
    return EXIT_OK if report.ok else EXIT_FAILED


def run_configured_cycle(config, now: datetime, runner: str = "FnApiRunner", extra: list[str] | None = None):
    """Load the rules, run one cycle, print its summary; returns the ``CycleReport``."""
    from ratebeam.pipelines.cycle import run_cycle
    from ratebeam.pipelines.rating import load_rater

    engine = _engine(config)
    rater = load_rater(engine, config.metrics)
    engine.dispose()
    print(f"ratebeam run: rating due periods up to {now.isoformat()} ({runner})", file=sys.stderr)
    report = run_cycle(config, rater, now=now, runner=runner, extra_options=extra)
    print_cycle_report(report)
    return report


def print_cycle_report(report) -> None:
    """The run's counters and, when some frames failed, one line per failed frame."""
    c = report.counters
    print(
        f"scopes: {c.get('scopes_fetched', 0)} fetched, {c.get('scopes_leased', 0)} rated, "
        f"{c.get('scopes_up_to_date', 0)} up to date, {c.get('scopes_skipped_inactive', 0)} inactive, "
        f"{c.get('scopes_skipped_leased_elsewhere', 0)} busy in another run",
        file=sys.stderr,
    )
    print(
        f"periods: {c.get('periods_planned', 0)} due, {c.get('periods_committed', 0)} committed; "
        f"points: {c.get('points_collected', 0)} collected, {c.get('points_rated', 0)} rated, "
        f"{c.get('points_written', 0)} written",
        file=sys.stderr,
    )
    requests = f"requests: {c.get('collector_calls', 0)} collector calls"
    if "prometheus_requests" in c:
        requests += f", {c['prometheus_requests']} Prometheus HTTP requests"
    print(requests, file=sys.stderr)
    if report.failures:
        print(f"{len(report.failures)} frame(s) failed (run {report.run_id}; all in the dead-letter table):",
              file=sys.stderr)
        for f in report.failures[:MAX_FAILURE_LINES]:
            print(f"  scope {f.scope_id} period {f.begin.isoformat()} [{f.stage}] {f.reason}", file=sys.stderr)
        if len(report.failures) > MAX_FAILURE_LINES:
            print(f"  ... and {len(report.failures) - MAX_FAILURE_LINES} more", file=sys.stderr)
    if c.get("scopes_lease_lost"):
        print(f"{c['scopes_lease_lost']} scope(s) lost their lease before the commit", file=sys.stderr)


def cmd_demo(args: argparse.Namespace) -> int:
    from ratebeam.pipelines.demo import run_demo

    return run_demo(Path(args.dir))


def cmd_rate(args: argparse.Namespace) -> int:
    from ratebeam.pipelines.rate_command import run_rate

    return run_rate(args.rules, args.usage)


# ---- db / rules / state ----------------------------------------------------------------------------


def cmd_db(args: argparse.Namespace) -> int:
    from ratebeam.connectors.sql.migrations import upgrade

    config = _config(args)
    engine = _engine(config, check=False)
    applied = upgrade(engine)
    for step in applied:
        print(f"applied migration {step}")
    if not applied:
        print("schema is up to date")
    return EXIT_OK


def cmd_rules(args: argparse.Namespace) -> int:
    from ratebeam.connectors.sql import rules_repository as repo
    from ratebeam.pipelines import interchange

    config = _config(args)
    if args.rules_command == "import":
        rules = interchange.read_rules(args.file)
        engine = _engine(config)
        repo.replace_rules(engine, rules)
        enable_hashmap_if_unset(engine)
        print(f"imported {len(rules.services)} service(s), {len(rules.fields)} field(s), "
              f"{len(rules.mappings)} mapping(s), {len(rules.thresholds)} threshold(s) from {args.file}")
        return EXIT_OK
    rules = repo.load_rules(_engine(config))
    if args.rules_command == "export":
        if args.file == "-":
            interchange.write_rules(rules, sys.stdout)
        else:
            with open(args.file, "w", encoding="utf-8") as out:
                interchange.write_rules(rules, out)
        return EXIT_OK
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
    print_table(rows, ["service", "field", "value", "kind", "type", "cost", "group", "tenant", "start", "end"])
    return EXIT_OK


def enable_hashmap_if_unset(engine) -> None:
    """A CloudKitty module without a state row is disabled; importing rules means wanting them used."""
    import sqlalchemy as sa

    from ratebeam.connectors.sql.models import ModuleState
    from ratebeam.connectors.sql.rules_repository import set_module_state

    with engine.connect() as conn:
        exists = conn.execute(sa.select(ModuleState.name).where(ModuleState.name == "hashmap")).first()
    if exists is None:
        set_module_state(engine, "hashmap", enabled=True)
        print("enabled the hashmap rating module (it had no state row)")


def cmd_modules(args: argparse.Namespace) -> int:
    from ratebeam.connectors.sql.rules_repository import module_states, set_module_state
    from ratebeam.pipelines.rating import MODULE_NAMES

    engine = _engine(_config(args))
    if args.modules_command == "list":
        states = module_states(engine, MODULE_NAMES)
        print_table([{"module": m.name, "enabled": m.enabled, "priority": m.priority} for m in states.values()],
                    ["module", "enabled", "priority"])
    elif args.modules_command == "priority":
        set_module_state(engine, args.module, priority=args.priority)
        print(f"module {args.module}: priority {args.priority}")
    else:
        set_module_state(engine, args.module, enabled=args.modules_command == "enable")
        print(f"module {args.module}: {args.modules_command}d")
    return EXIT_OK


def cmd_scripts(args: argparse.Namespace) -> int:
    from ratebeam.connectors.sql import rules_repository as repo
    from ratebeam.transforms.scripted import ScriptError, load_script

    engine = _engine(_config(args))
    if args.scripts_command == "add":
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(args.file, "", f"cannot read: {exc.strerror}") from None
        try:
            script = load_script(text)
        except ScriptError as exc:
            raise InputError(args.file, exc.location, exc.message) from None
        start = parse_instant(args.start, "--start") if args.start else None
        end = parse_instant(args.end, "--end") if args.end else None
        repo.save_script(engine, script.name, text, start=start, end=end)
        print(f"script {script.name!r} saved ({len(script.steps)} step(s))")
    elif args.scripts_command == "delete":
        if not repo.delete_script(engine, args.name):
            raise CommandError(f"no script named {args.name!r}", EXIT_BAD_INPUT)
        print(f"script {args.name!r} deleted")
    else:
        print_table([{"name": s.name, "start": s.start, "end": s.end} for s in repo.load_scripts(engine)],
                    ["name", "start", "end"])
    return EXIT_OK


def cmd_state(args: argparse.Namespace) -> int:
    from ratebeam.connectors.sql.state_store import StateStore

    config = _config(args)
    store = StateStore(_engine(config), config.scope_key, config.fetcher.backend, config.collector.backend)
    if args.state_command == "list":
        rows = [
            {"scope": s.scope, "last_processed": s.last_processed, "active": s.active,
             "lease_owner": s.lease_owner or "", "lease_expires_at": s.lease_expires_at}
            for s in store.list_states()
        ]
        print_table(rows, ["scope", "last_processed", "active", "lease_owner", "lease_expires_at"])
        return EXIT_OK
    if args.state_command in ("activate", "deactivate"):
        try:
            store.set_active(args.scope, args.state_command == "activate")
        except KeyError:
            raise CommandError(f"scope {args.scope!r} has no state yet", EXIT_BAD_INPUT) from None
        print(f"scope {args.scope}: {args.state_command}d")
        return EXIT_OK
    return reset_scope(config, store, args.scope, parse_instant(args.begin, "--from"))


def reset_scope(config, store, scope: str, begin: datetime) -> int:
    """Delete the scope's rated data from ``begin`` on and make ``begin`` the next period rated.

    Unlike CloudKitty (spec §6.8) the period at ``begin`` is re-rated: state is set to the period
    before it.  Storage is cleaned first; a crash in between leaves data that the re-rating
    rewrites (idempotent writes).
    """
    from datetime import timedelta

    from ratebeam.connectors.registry import make_backend

    if begin.timestamp() % config.period:
        raise InputError("command line", "--from", f"not aligned on the {config.period} s period",
                         begin.isoformat())
    for storage in config.storage:
        backend = make_backend(storage)
        backend.init()
        backend.delete(begin=begin, end=None, filters={"scope_id": scope})
        backend.close()
    store.reset(scope, begin - timedelta(seconds=config.period))
    print(f"scope {scope}: rated data from {begin.isoformat()} deleted; next run rates from there")
    return EXIT_OK


# ---- report ----------------------------------------------------------------------------------------


def _month_bounds(now: datetime) -> tuple[datetime, datetime]:
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def cmd_report(args: argparse.Namespace) -> int:
    from ratebeam.connectors.registry import make_backend
    from ratebeam.connectors.storage.base import TotalQuery

    config = _config(args)
    default_begin, default_end = _month_bounds(datetime.now(UTC))
    begin = parse_instant(args.begin, "--begin") if args.begin else default_begin
    end = parse_instant(args.end, "--end") if args.end else default_end
    filters = _filters(args.filter)
    backend = make_backend(config.storage[0])
    backend.init()
    try:
        if args.report_command == "summary":
            groupby = tuple(g.strip() for g in args.groupby.split(",") if g.strip())
            result = backend.total(TotalQuery(groupby=groupby, begin=begin, end=end, metric_types=tuple(args.type),
                                              filters=filters, offset=args.offset, limit=args.limit))
            if args.format == "json":
                json.dump({"total": result.total, "results": result.results}, sys.stdout, default=_json_default,
                          indent=1)
                print()
            else:
                columns = ["begin", "end", *groupby_columns(groupby), "qty", "rate"]
                print_table(result.results, columns)
                print(f"({result.total} row(s))")
            return EXIT_OK
        retrieved = backend.retrieve(begin=begin, end=end, filters=filters, metric_types=tuple(args.type),
                                     offset=args.offset, limit=args.limit)
        print_dataframes(retrieved, args.format)
        return EXIT_OK
    finally:
        backend.close()


def groupby_columns(groupby: tuple[str, ...]) -> list[str]:
    """The result keys a ``total`` groupby produces (``time`` is in begin/end already)."""
    from ratebeam.transforms.schema import TIME_KEYS

    shortcuts = dict(zip(("time-w", "time-d", "time-m", "time-y"), TIME_KEYS, strict=True))
    return [shortcuts.get(g, g) for g in groupby if g != "time"]


def print_dataframes(retrieved, fmt: str) -> None:
    """Rated points as CloudKitty's ``/v2/dataframes`` shape (json) or a table."""
    from ratebeam.pipelines.dataframes import to_cloudkitty_dataframes

    if fmt == "json":
        json.dump({"total": retrieved.total, "dataframes": to_cloudkitty_dataframes(retrieved.points)},
                  sys.stdout, default=_json_default, indent=1)
        print()
        return
    import polars as pl

    frame = pl.from_arrow(retrieved.points)
    labels = [c for c in frame.columns if c.startswith(("groupby.", "metadata."))]
    rows = frame.to_dicts()
    print_table(rows, ["begin", "scope_id", "type", "qty", "unit", "price", *labels])
    print(f"({len(rows)} of {retrieved.total} point(s))")


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
#: Failed frames listed by ``ratebeam run``; the rest are counted (and kept in the dead letters).
MAX_FAILURE_LINES = 20
