"""``report summary`` and ``report dataframes``: rated data read back from one storage backend.

``--backend NAME`` picks the backend (its ``backend:`` name, or its position in ``storage.backends``
when two share a name); the default is the first.  Reading never creates or changes storage: the
backend's ``check_readable`` (not ``init``) refuses a missing index, database, bucket or Parquet
root by name, exit 2, instead of creating an empty one and reporting 0 rows.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ratebeam.connectors.registry import names
from ratebeam.pipelines.commands.common import CommandError, bounded, load, parse_instant
from ratebeam.pipelines.commands.output import write_json, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.connectors.storage.base import RetrieveResult, StorageBackend, TotalQuery, TotalResult
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.transforms.metric_defs import MetricsConfig

#: Largest ``--offset`` and ``--limit``: a 32-bit count, what every storage's paging takes
#: (Elasticsearch's ``from``/``size`` and InfluxDB's ``OFFSET``/``LIMIT`` refuse or overflow past it).
PAGE_LIMIT = 2**31 - 1


def filters_of(items: list[str], scopes: list[str] | None = None) -> dict[str, str | list[str]]:
    """``--filter KEY=VALUE`` (or CloudKitty's ``KEY:VALUE``) and ``--scope``; a key twice takes either value."""
    from ratebeam.pipelines.commands.grammar import key_value
    from ratebeam.transforms.schema import SCOPE

    out: dict[str, str | list[str]] = {}
    for key, value in [key_value(item) for item in items] + [(SCOPE, scope) for scope in scopes or []]:
        previous = out.get(key)
        if previous is None:
            out[key] = value
        else:
            out[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
    return out


def _query(args: argparse.Namespace, *, metrics: bool):
    """The configuration (``metrics``: with metrics.yml), the window (this month by default), the filters."""
    from ratebeam.connectors.storage.base import default_bounds

    config = load(args, metrics=metrics)
    from ratebeam.pipelines.commands.grammar import spelled

    begin = parse_instant(args.begin, spelled(args, "begin")) if args.begin is not None else None
    end = parse_instant(args.end, spelled(args, "end")) if args.end is not None else None
    begin, end = default_bounds(begin, end)
    if begin >= end:  # an empty window would report nothing and exit 0
        default = "" if args.end is not None else ", the default: start of next month"
        raise InputError("command line", spelled(args, "begin"), f"must be before {spelled(args, 'end')} ({end.isoformat()}{default})",
                         begin.isoformat())
    if hasattr(args, "limit"):  # the paginated reports (``report chart`` reads every row)
        bounded(args.offset, "--offset", 0, PAGE_LIMIT)
        bounded(args.limit, "--limit", 1, PAGE_LIMIT)
    return config, begin, end, filters_of(args.filter, getattr(args, "scope", None))


def cmd_report_summary(args: argparse.Namespace) -> int:
    """Totals of qty and price, grouped as ``--groupby`` says."""
    from ratebeam.connectors.storage.base import TotalQuery
    from ratebeam.transforms.schema import TYPE, UNIT

    config, begin, end, filters = _query(args, metrics=True)  # --groupby is checked against it
    custom_fields = getattr(args, "custom_fields", None)
    groupby = tuple(dict.fromkeys(g.strip() for item in args.groupby for g in item.split(",") if g.strip()))
    check_groupby(groupby, config.metrics)
    warn_unknown_selection(filters, args.type, config.metrics, config.scope_key)
    per_unit = custom_fields is None and TYPE not in groupby  # qty of different units is never summed
    query = TotalQuery(groupby=(*groupby, TYPE) if per_unit else groupby, begin=begin, end=end,
                       metric_types=tuple(args.type), filters=filters, custom_fields=custom_fields,
                       offset=0 if per_unit else args.offset, limit=PAGE_LIMIT if per_unit else args.limit)
    result = read_totals(config, query, args.backend)
    total, rows = result.total, result.results
    if per_unit:
        rows = sum_per_unit(rows, groupby, {m.rating_type: m.unit for m in config.metrics.metrics})
        total, rows = len(rows), rows[args.offset:args.offset + args.limit]
    if args.format == "json":
        write_json({"total": total, "results": rows})
    else:
        sums = ["qty", "rate"] if custom_fields is None else _custom_columns(rows, groupby)
        write_rows(rows, ["begin", "end", *groupby_columns(groupby), *([UNIT] if per_unit else []), *sums],
                   args.format, footer=f"({total} row(s))")
    return EXIT_OK


def sum_per_unit(rows: list[dict], groupby: tuple[str, ...], units: dict[str, str]) -> list[dict]:
    """Rows grouped by ``groupby`` and type, summed again per unit: qty is added only within one unit.

    A type no longer in metrics.yml has no known unit: it keeps a row of its own (``?`` and its name).
    """
    from ratebeam.transforms.schema import TYPE, UNIT

    columns = groupby_columns(groupby)
    out: dict[tuple, dict] = {}
    for row in rows:
        unit = units.get(row[TYPE], f"? ({row[TYPE]})")
        key = (row["begin"], row["end"], *(row.get(c) for c in columns), unit)
        if key in out:
            out[key]["qty"] += row["qty"]
            out[key]["rate"] += row["rate"]
        else:
            out[key] = {k: v for k, v in row.items() if k != TYPE} | {UNIT: unit}
    return list(out.values())


def read_totals(config: RatebeamConfig, query: TotalQuery, backend_name: str | None = None) -> TotalResult:
    """``total`` of the storage backend ``report`` reads (``--backend``; ``report summary``, ``report chart``).

    Reading never creates storage: ``check_readable`` names a missing root, database or index.
    """
    backend = reading_backend(config, backend_name)
    if query.custom_fields is not None and not backend.capabilities.supports_custom_fields:
        raise CommandError(f"--custom-fields: the {backend.capabilities.name} storage does not support "
                           "custom fields (InfluxDB only)", EXIT_BAD_INPUT)
    try:
        backend.check_readable()
        return backend.total(query)
    finally:
        backend.close()


def check_groupby(groupby: tuple[str, ...], metrics: MetricsConfig) -> None:
    """Refuse a ``--groupby`` item no stored point can carry (it would give one row with an empty key).

    Valid: ``type``, ``time``, ``time-d|w|m|y``, the time labels and every metric's groupby key.  A
    metadata key is refused with why: summaries group by groupby labels only, as CloudKitty's v2
    summary does (Elasticsearch groups by ``groupby.*``), while ``--filter`` matches metadata too.
    """
    from ratebeam.connectors.storage.base import TIME, TIME_GROUPBYS
    from ratebeam.transforms.schema import TIME_KEYS, TYPE

    keys = {TYPE, TIME, *TIME_GROUPBYS, *TIME_KEYS, *(k for m in metrics.metrics for k in m.groupby)}
    for item in groupby:
        if item in keys:
            continue
        owners = [m.rating_type for m in metrics.metrics if item in m.metadata]
        if owners:
            raise InputError("command line", "--groupby",
                             f"a metadata key (of {', '.join(owners)}), not a groupby key: summaries group by "
                             "groupby keys only, as CloudKitty's v2 summary does (--filter matches metadata "
                             "keys too)", item)
        raise InputError("command line", "--groupby",
                         f"unknown key (known: {', '.join(sorted(keys))})", item)


def warn_unknown_selection(filters: dict, types: list[str], metrics: MetricsConfig, scope_key: str) -> None:
    """Warn (stderr) of a ``--filter`` key or ``--type`` that no metric of metrics.yml has.

    The summary will be empty unless points stored before metrics.yml changed carry it: so it is a
    warning, not a refusal (a typo would otherwise report 0 with no word).
    """
    from ratebeam.transforms.schema import SCOPE, TIME_KEYS, TYPE

    keys = {SCOPE, TYPE, scope_key, *TIME_KEYS, *(k for m in metrics.metrics for k in (*m.groupby, *m.metadata))}
    known_types = sorted({m.rating_type for m in metrics.metrics})
    for key in sorted(set(filters) - keys):
        print(f"ratebeam report: warning: --filter {key}: no metric of metrics.yml has that label (known: "
              f"{', '.join(sorted(keys))}); only points stored before a change of metrics.yml can match",
              file=sys.stderr)
    for type_ in dict.fromkeys(t for t in types if t not in known_types):
        print(f"ratebeam report: warning: --type {type_}: not a type of metrics.yml (known: {', '.join(known_types)}); "
              "only points stored before a change of metrics.yml can match", file=sys.stderr)


def _custom_columns(results: list[dict], groupby: tuple[str, ...]) -> list[str]:
    """The columns ``custom_fields`` produced: every key of the rows that is no bound or group."""
    known = {"begin", "end", *groupby_columns(groupby)}
    return list(dict.fromkeys(k for row in results for k in row if k not in known))


def cmd_report_dataframes(args: argparse.Namespace) -> int:
    """The rated points themselves, as CloudKitty's ``/v2/dataframes`` (json) or a table."""
    config, begin, end, filters = _query(args, metrics=False)
    backend = reading_backend(config, args.backend)
    try:
        backend.check_readable()
        retrieved = backend.retrieve(begin=begin, end=end, filters=filters, metric_types=tuple(args.type),
                                     offset=args.offset, limit=args.limit)
    finally:
        backend.close()
    if args.type and not retrieved.total:  # an empty answer is an answer (exit 0), but a typo must be seen
        print(f"ratebeam report: warning: --type {', '.join(dict.fromkeys(args.type))}: no stored point of "
              f"{'that type' if len(set(args.type)) == 1 else 'those types'} in [{begin.isoformat()}, "
              f"{end.isoformat()})" + ("" if not filters else " with the filters given"), file=sys.stderr)
    print_dataframes(retrieved, args.format)
    return EXIT_OK


def reading_backend(config: RatebeamConfig, name: str | None) -> StorageBackend:
    """The backend ``--backend NAME`` names (default: the first): a ``backend:`` name or a position.

    It knows the configuration's ``scope_key``, so the points CloudKitty wrote before the switch
    (no ratebeam scope marker) are found by a scope filter and carry their scope.
    """
    from ratebeam.connectors.registry import make_backend

    backends = config.storage
    if name is None:
        return make_backend(backends[0], config.scope_key)
    known = ", ".join(f"{i}: {b.backend}" for i, b in enumerate(backends))
    if name.isdigit():
        if int(name) >= len(backends):
            raise InputError("command line", "--backend", f"no storage backend at that position (configured: "
                             f"{known})", name)
        return make_backend(backends[int(name)], config.scope_key)
    matching = [b for b in backends if b.backend == name]
    if not matching:
        raise InputError("command line", "--backend", f"not a configured storage backend (configured: {known})",
                         name)
    if len(matching) > 1:
        raise InputError("command line", "--backend", f"several backends have that name: give the position "
                         f"(configured: {known})", name)
    return make_backend(matching[0], config.scope_key)


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend NAME``, shared by every ``report`` sub-command (the names are the registry's)."""
    parser.add_argument("--backend", metavar="NAME",
                        help=f"the storage backend to read: its name ({', '.join(names('storage'))}) or its position "
                             "in storage.backends (0 = the first); default: the first")


def groupby_columns(groupby: tuple[str, ...]) -> list[str]:
    """The result keys a ``total`` groupby produces (``time`` is in begin/end already)."""
    from ratebeam.transforms.schema import TIME_KEYS

    shortcuts = dict(zip(("time-w", "time-d", "time-m", "time-y"), TIME_KEYS, strict=True))
    return [shortcuts.get(g, g) for g in groupby if g != "time"]


def print_dataframes(retrieved: RetrieveResult, fmt: str) -> None:
    """Rated points as CloudKitty's ``/v2/dataframes`` shape (json), a table or CSV (the table's columns)."""
    from ratebeam.pipelines.dataframes import to_cloudkitty_dataframes

    if fmt == "json":
        write_json({"total": retrieved.total, "dataframes": to_cloudkitty_dataframes(retrieved.points)})
        return
    import polars as pl

    frame = pl.from_arrow(retrieved.points)
    labels = [c for c in frame.columns if c.startswith(("groupby.", "metadata."))]
    rows = frame.to_dicts()
    write_rows(rows, ["begin", "scope_id", "type", "qty", "unit", "price", *labels], fmt,
               footer=f"({len(rows)} of {retrieved.total} point(s))")
