"""Rate usage with CloudKitty 25.0.0's own hashmap module: the reference of the differential test.

Runs INSIDE CloudKitty's virtual environment (``tests/cloudkitty/setup_venv.sh``), never in
ratebeam's.  For each case it loads a rules JSON file (``docs/formats.md``) into
CloudKitty's own hashmap tables through CloudKitty's own DB API (``cloudkitty.rating.hash.db.api``:
its validations, its overlap check, its load queries), then rates the usage JSONL frame by frame
(frame = scope, begin, end) with ``cloudkitty.rating.hash.HashMap`` instantiated per scope as
``tenant_id`` and reloaded with ``reload_config(period begin)`` before every frame, as CloudKitty's
orchestrator does.  It prints rated JSONL in the interchange format.

The database is an in-memory SQLite one whose NUMERIC columns store exact decimal TEXT (`cloudkitty/utils/__init__.py:250-292`:
SQLAlchemy's Numeric on SQLite goes through a float, so 0.1 would rate as
0.1000000000000000055511151231).  Costs are read back with 28 decimals and levels with 8, as
MySQL/PostgreSQL return them for NUMERIC(40,28) / NUMERIC(20,8); every rule is read back after
loading and compared with the file, so a non-exact store fails loudly.  The two unique constraints
on mappings that CloudKitty's migration 8a591f85865f drops are dropped here too.

Usage::

    ck_rate.py RULES USAGE [--stats FILE]   rated JSONL on stdout; exit 3 if a frame failed
    ck_rate.py --batch MANIFEST [--stats FILE]
        MANIFEST: JSON lines {"rules": path, "usage": path, "out": path}; each case's rated JSONL
        goes to its "out"; one process rates every case (CloudKitty's import takes seconds).
        A case whose files CloudKitty refuses gets {"case_error": "..."} in its output; exit 2.

``--stats FILE`` writes, per case, the SQL statements CloudKitty issued (counted with a SQLAlchemy
``before_cursor_execute`` event) per ``reload_config`` (min and max over the frames) and in total
while rating (``HashMap`` constructions included), and the seconds spent rating (constructions,
reloads and ``process``; parsing and output excluded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Context, Decimal
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")  # eventlet / oslo deprecation noise on import

import cloudkitty.config  # noqa: E402,F401  (registers CloudKitty's option defaults)
import sqlalchemy as sa  # noqa: E402
from oslo_config import cfg  # noqa: E402
from oslo_db import options as db_options  # noqa: E402

db_options.set_defaults(cfg.CONF, connection="sqlite://")
cfg.CONF([], project="cloudkitty", default_config_files=[])

from cloudkitty import dataframe  # noqa: E402
from cloudkitty import db as ck_db  # noqa: E402
from cloudkitty.rating.hash import HashMap  # noqa: E402
from cloudkitty.rating.hash.db import api as hash_db_api  # noqa: E402
from cloudkitty.rating.hash.db.sqlalchemy import models  # noqa: E402

#: Interchange default for a mapping without ``start`` (rules in a file apply to all history).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
AUTHOR = "ratebeam-diff"
EXIT_FRAME_FAILED = 3
EXIT_BAD_CASE = 2

_WIDE = Context(prec=200, rounding=ROUND_HALF_UP)


class _ExactNumeric(sa.types.TypeDecorator):
    """NUMERIC(p, s) stored as TEXT with exactly ``s`` decimals, read back as that Decimal.

    TEXT affinity keeps SQLite from turning the value into a float; a fixed number of decimals
    keeps the unique constraints on ``level`` numeric (``8`` and ``8.0`` collide as on PostgreSQL).
    """

    impl = sa.Text
    cache_ok = True

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        if value is None:
            return None
        return format(Decimal(value).quantize(Decimal(1).scaleb(-self.scale), context=_WIDE), "f")

    def process_result_value(self, value: Any, dialect: Any) -> Decimal | None:
        return None if value is None else Decimal(value)


def _prepare_schema() -> sa.Engine:
    """Patch the hashmap models' NUMERIC columns to exact TEXT and create the tables."""
    models.HashMapMapping.__table__.c.cost.type = _ExactNumeric(28)
    models.HashMapThreshold.__table__.c.cost.type = _ExactNumeric(28)
    models.HashMapThreshold.__table__.c.level.type = _ExactNumeric(8)
    mappings = models.HashMapMapping.__table__
    for constraint in list(mappings.constraints):
        if constraint.name in ("uniq_field_mapping", "uniq_service_mapping"):
            mappings.constraints.discard(constraint)
    # oslo.db sleeps 0 s on every connection check-in to let eventlet green threads run; one thread
    # has none to run, and each sleep costs ~0.1 ms: a third of CloudKitty's time here.  Off.
    ck_db._create_facade_lazily().configure(thread_checkin=False)
    with ck_db.session_for_write() as session:
        engine = session.get_bind()
    models.Base.metadata.create_all(engine)
    return engine


ENGINE = _prepare_schema()
API = hash_db_api.get_instance()


class _StatementCounter:
    """Counts every statement CloudKitty sends to the database."""

    def __init__(self) -> None:
        self.count = 0
        sa.event.listen(ENGINE, "before_cursor_execute", self._seen)

    def _seen(self, *_args: Any) -> None:
        self.count += 1


COUNTER = _StatementCounter()


class CaseError(Exception):
    """A rules or usage file CloudKitty cannot take (reported, not a traceback)."""


# --- rules -------------------------------------------------------------------------------------


def _number(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise CaseError(f"{where}: not a decimal: {value!r}")
    try:
        return Decimal(value)
    except ArithmeticError as exc:
        raise CaseError(f"{where}: not a decimal: {value!r}") from exc


def _instant(value: Any, where: str) -> datetime:
    """An ISO-8601 instant as an aware UTC datetime (naive means UTC)."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError) as exc:
        raise CaseError(f"{where}: not an ISO-8601 timestamp: {value!r}") from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _db_time(value: datetime) -> datetime:
    """CloudKitty's DB datetimes are naive (UTC on a UTC host)."""
    return value.astimezone(UTC).replace(tzinfo=None)


def _reset_tables() -> None:
    with ENGINE.begin() as conn:
        for model in (models.HashMapMapping, models.HashMapThreshold, models.HashMapField,
                      models.HashMapService, models.HashMapGroup):
            conn.execute(sa.delete(model.__table__))


class _Loader:
    """Creates one rules document through CloudKitty's DB API and checks it reads back exactly."""

    def __init__(self, doc: dict[str, Any], source: str) -> None:
        self.doc = doc
        self.source = source
        self.groups: dict[str, str] = {}
        self.written: list[tuple[str, str, Decimal, Decimal | None]] = []  # (kind, uuid, cost, level)

    def group(self, name: Any, where: str) -> str | None:
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise CaseError(f"{where}.group: not a group name: {name!r}")
        if name not in self.groups:
            self.groups[name] = API.create_group(name).group_id
        return self.groups[name]

    def load(self) -> None:
        for i, name in enumerate(self.doc.get("groups") or []):
            self.group(name, f"{self.source}: groups[{i}]")
        for si, service in enumerate(self.doc.get("services") or []):
            where = f"{self.source}: services[{si}]"
            service_id = API.create_service(service["name"]).service_id
            self.rules(service, where, service_id=service_id)
            for fi, fld in enumerate(service.get("fields") or []):
                field_id = API.create_field(service_id, fld["name"]).field_id
                self.rules(fld, f"{where}.fields[{fi}]", field_id=field_id)
            self.check_field_order(service_id, service, where)
        self.check_exact()

    def rules(self, parent: dict[str, Any], where: str, **parent_id: str) -> None:
        for mi, rule in enumerate(parent.get("mappings") or []):
            at = f"{where}.mappings[{mi}]"
            cost = _number(rule.get("cost"), f"{at}.cost")
            start = _instant(rule["start"], f"{at}.start") if rule.get("start") is not None else EPOCH
            end = _instant(rule["end"], f"{at}.end") if rule.get("end") is not None else None
            try:
                created = API.create_mapping(
                    cost=cost, map_type=rule.get("type", "flat"), value=rule.get("value"),
                    group_id=self.group(rule.get("group"), at), tenant_id=rule.get("tenant_id"),
                    start=_db_time(start), end=_db_time(end) if end else None,
                    created_by=AUTHOR, **parent_id)
            except hash_db_api.BaseHashMapError as exc:
                raise CaseError(f"{at}: refused by CloudKitty: {exc}") from exc
            self.written.append(("mapping", created.mapping_id, cost, None))
        for ti, rule in enumerate(parent.get("thresholds") or []):
            at = f"{where}.thresholds[{ti}]"
            cost = _number(rule.get("cost"), f"{at}.cost")
            level = _number(rule.get("level", "0"), f"{at}.level")
            try:
                created = API.create_threshold(
                    level=level, cost=cost, map_type=rule.get("type", "flat"),
                    group_id=self.group(rule.get("group"), at), tenant_id=rule.get("tenant_id"),
                    **parent_id)
            except hash_db_api.BaseHashMapError as exc:
                raise CaseError(f"{at}: refused by CloudKitty: {exc}") from exc
            self.written.append(("threshold", created.threshold_id, cost, level))

    def check_field_order(self, service_id: str, service: dict[str, Any], where: str) -> None:
        """Warn when CloudKitty's field load order is not the file's (it breaks threshold ties)."""
        with_thresholds = [f["name"] for f in service.get("fields") or [] if f.get("thresholds")]
        if len(with_thresholds) < 2:
            return
        loaded = [API.get_field(uuid=u).name for u in API.list_fields(service_id)]
        in_file = [f["name"] for f in service.get("fields") or []]
        if loaded != in_file:
            print(f"ck_rate: {where}: CloudKitty loads the fields in the order {loaded}, the file "
                  f"lists {in_file}; threshold ties across fields follow CloudKitty's order",
                  file=sys.stderr)

    def check_exact(self) -> None:
        """Every cost and level reads back as the exact decimal of the file (`cloudkitty/utils/__init__.py:250-292`)."""
        for kind, uid, cost, level in self.written:
            row = API.get_mapping(uid) if kind == "mapping" else API.get_threshold(uid)
            if row.cost != cost or (level is not None and row.level != level):
                raise CaseError(f"{self.source}: {kind} {uid} stored inexactly: cost {cost} -> "
                                f"{row.cost!r}, level {level} -> {getattr(row, 'level', None)!r}")


def load_rules(path: Path) -> None:
    """Replace CloudKitty's hashmap tables by the rules of ``path``."""
    try:
        doc = json.loads(path.read_text(), parse_float=Decimal)
    except (OSError, ValueError) as exc:
        raise CaseError(f"{path}: cannot read rules JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CaseError(f"{path}: rules JSON must be an object")
    _reset_tables()
    _Loader(doc, str(path)).load()


# --- usage -------------------------------------------------------------------------------------


def _usage_records(path: Path) -> list[Any]:
    """Usage JSONL, or one JSON list, or one ``{"points": [...]}`` object."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CaseError(f"{path}: cannot read usage: {exc}") from exc
    try:
        doc = json.loads(text)
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise CaseError(f"{path}: invalid JSON: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("points"), list):
        return doc["points"]
    return doc if isinstance(doc, list) else [doc]


class Point:
    """One usage point as CloudKitty's collector would hand it to the hashmap."""

    __slots__ = ("begin", "end", "i", "point", "scope", "type")

    def __init__(self, i: int, rec: dict[str, Any], source: str) -> None:
        where = f"{source}: point {i}"
        groupby = rec.get("groupby") or {}
        metadata = rec.get("metadata") or {}
        self.i = i
        self.type = rec["type"]
        scope = rec.get("scope")
        self.scope = groupby.get("project_id") if scope is None else scope
        self.begin = _instant(rec.get("begin"), f"{where}.begin")
        self.end = _instant(rec.get("end"), f"{where}.end")
        self.point = dataframe.DataPoint(rec.get("unit"), rec["qty"], rec.get("price", 0), groupby, metadata)


def read_usage(path: Path) -> list[Point]:
    points = []
    for i, rec in enumerate(_usage_records(path)):
        try:
            points.append(Point(i, rec, str(path)))
        except (KeyError, TypeError, AttributeError, ArithmeticError) as exc:
            raise CaseError(f"{path}: point {i}: invalid usage point: {exc!r}") from exc
    return points


def _frames(points: Iterable[Point]) -> dict[tuple[Any, datetime, datetime], list[Point]]:
    frames: dict[tuple[Any, datetime, datetime], list[Point]] = {}
    for p in points:
        frames.setdefault((p.scope, p.begin, p.end), []).append(p)
    return frames


# --- rating ------------------------------------------------------------------------------------


class CaseResult:
    """Prices (or the error of their frame) per point index, plus the statement counts."""

    def __init__(self) -> None:
        self.prices: dict[int, Decimal | None] = {}
        self.errors: dict[int, str] = {}
        self.frames = 0
        self.failed_frames = 0
        self.reload_statements: list[int] = []  # per frame
        self.rating_statements = 0
        self.rating_seconds = 0.0


def rate(points: list[Point]) -> CaseResult:
    """Rate every frame as CloudKitty's orchestrator does: one HashMap per scope, reloaded per frame."""
    result = CaseResult()
    modules: dict[Any, HashMap] = {}
    frames = _frames(points)
    result.frames = len(frames)
    built = []
    for (scope, begin, end), members in frames.items():
        frame = dataframe.DataFrame(start=begin, end=end)
        for p in members:
            frame.add_point(p.point, p.type)
        built.append((scope, begin, members, frame))
    first = COUNTER.count
    started = time.perf_counter()
    for scope, begin, members, frame in built:
        module = modules.get(scope)
        if module is None:
            module = modules[scope] = HashMap(scope)
        before = COUNTER.count
        try:
            module.reload_config(begin)
            result.reload_statements.append(COUNTER.count - before)
            rated = module.process(frame)
        except Exception as exc:  # any exception fails the whole frame (`cloudkitty/rating/hash/__init__.py:193-199`)
            result.failed_frames += 1
            for p in members:
                result.prices[p.i] = None
                result.errors[p.i] = f"{type(exc).__name__}: {exc}"
            continue
        by_type: dict[str, list[Point]] = {}
        for p in members:
            by_type.setdefault(p.type, []).append(p)
        for type_, out_points in rated.itertypes():
            for p, out in zip(by_type[type_], out_points, strict=True):
                result.prices[p.i] = out.price
    result.rating_seconds = time.perf_counter() - started
    result.rating_statements = COUNTER.count - first
    return result


def _iso(value: datetime) -> str:
    return value.isoformat()


def rated_lines(points: list[Point], result: CaseResult) -> Iterator[str]:
    """The rated JSONL of interchange.md, in input order, then the summary line."""
    total = Decimal(0)
    for p in points:
        price = result.prices[p.i]
        line: dict[str, Any] = {"i": p.i, "type": p.type, "scope": p.scope, "begin": _iso(p.begin),
                                "end": _iso(p.end), "qty": str(p.point.qty),
                                "price": None if price is None else format(price, "f")}
        if price is None:
            line["error"] = result.errors[p.i]
        else:
            total += price
        yield json.dumps(line)
    yield json.dumps({"summary": {"count": len(points), "frames": result.frames,
                                  "errors": result.failed_frames, "total": format(total, "f")}})


def run_case(rules: Path, usage: Path) -> tuple[list[str], CaseResult]:
    load_rules(rules)
    points = read_usage(usage)
    result = rate(points)
    return list(rated_lines(points, result)), result


def _stats(rules: Path, result: CaseResult, points: int) -> dict[str, Any]:
    return {"rules": str(rules), "points": points, "frames": result.frames,
            "failed_frames": result.failed_frames, "reload_statements_min": min(result.reload_statements, default=0),
            "reload_statements_max": max(result.reload_statements, default=0),
            "rating_statements": result.rating_statements, "rating_seconds": result.rating_seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rules", nargs="?", type=Path)
    parser.add_argument("usage", nargs="?", type=Path)
    parser.add_argument("--batch", type=Path, help="JSON lines of {rules, usage, out}")
    parser.add_argument("--stats", type=Path, help="write per-case SQL counts and timings here")
    args = parser.parse_args(argv)
    stats: list[dict[str, Any]] = []
    status = 0
    if args.batch:
        for line in args.batch.read_text().splitlines():
            if not line.strip():
                continue
            case = json.loads(line)
            rules, usage, out = Path(case["rules"]), Path(case["usage"]), Path(case["out"])
            try:
                lines, result = run_case(rules, usage)
            except CaseError as exc:
                out.write_text(json.dumps({"case_error": str(exc)}) + "\n")
                status = EXIT_BAD_CASE
                continue
            out.write_text("\n".join(lines) + "\n")
            stats.append(_stats(rules, result, len(lines) - 1))
    else:
        if not (args.rules and args.usage):
            parser.error("give RULES and USAGE, or --batch MANIFEST")
        try:
            lines, result = run_case(args.rules, args.usage)
        except CaseError as exc:
            print(f"ck_rate: {exc}", file=sys.stderr)
            return EXIT_BAD_CASE
        sys.stdout.write("\n".join(lines) + "\n")
        stats.append(_stats(args.rules, result, len(lines) - 1))
        status = EXIT_FRAME_FAILED if result.failed_frames else 0
    if args.stats:
        args.stats.write_text(json.dumps(stats, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
