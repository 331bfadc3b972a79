"""The storage conformance suite: the same cases and expectations for every storage backend.

A backend's test module subclasses ``StorageConformance`` and provides a ``make_backend`` fixture
returning a zero-argument factory of *fresh, empty* backends::

    class TestParquetConformance(StorageConformance):
        @pytest.fixture
        def make_backend(self, tmp_path):
            return lambda: ParquetStorage(str(tmp_path / "store"))

Every case writes rated tables built here (no rating kernel involved), then checks ``retrieve``,
``total`` and ``delete`` against expectations computed in plain Python from the same points.  Money
is compared exactly when ``capabilities.exact_decimals``, else with a 1e-9 relative tolerance.
Delete cases are skipped for backends that declare ``supports_delete=False``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

import pyarrow as pa
import pytest

from ratebeam.connectors.storage.base import StorageBackend, TotalQuery, TotalResult, as_decimal
from ratebeam.transforms.periods import month_start
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
    UNIT,
    groupby_column,
    metadata_column,
    usage_schema,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday: week "00" until Saturday the 6th
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
JANUARY = (T0, datetime(2024, 2, 1, tzinfo=UTC))


# -- building rated tables ------------------------------------------------------------------------


def time_keys(begin: datetime) -> dict[str, str]:
    """The four groupby keys CloudKitty adds to every point (`cloudkitty/collector/__init__.py:285-309`)."""
    return {
        "week_of_the_year": begin.strftime("%U"),
        "day_of_the_year": str(begin.timetuple().tm_yday),
        "month": str(begin.month),
        "year": f"{begin.year:04d}",
    }


@dataclass(frozen=True)
class Point:
    """One rated point as the suite reasons about it; ``groupby`` already holds the time keys."""

    scope: str
    type: str
    begin: datetime
    end: datetime
    qty: Decimal
    price: Decimal
    unit: str
    groupby: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)

    def key(self) -> tuple:
        """Everything but the money, hashable: what identifies a point in comparisons."""
        return (
            self.scope,
            self.type,
            self.begin,
            self.end,
            self.unit,
            tuple(sorted(self.groupby.items())),
            tuple(sorted(self.metadata.items())),
        )


def point(
    scope: str,
    type_: str,
    begin: datetime,
    qty: str | Decimal = "1",
    price: str | Decimal = "0",
    groupby: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    unit: str = "u",
    length: timedelta = HOUR,
) -> Point:
    """A point of ``scope`` with ``project_id = scope`` and the time keys in its groupby."""
    labels = {"project_id": scope, **(groupby or {}), **time_keys(begin)}
    return Point(
        scope, type_, begin, begin + length, Decimal(qty), Decimal(price), unit, labels, dict(metadata or {})
    )


def rated_table(points: Iterable[Point]) -> pa.Table:
    """A rated Arrow table (``transforms.schema`` columns) holding ``points``; absent key = null."""
    points = list(points)
    groupby = sorted({k for p in points for k in p.groupby})
    metadata = sorted({k for p in points for k in p.metadata})
    columns: dict[str, list[Any]] = {
        SCOPE: [p.scope for p in points],
        TYPE: [p.type for p in points],
        BEGIN: [p.begin for p in points],
        END: [p.end for p in points],
        QTY: [p.qty for p in points],
        PRICE: [p.price for p in points],
        UNIT: [p.unit for p in points],
    }
    columns |= {groupby_column(k): [p.groupby.get(k) for p in points] for k in groupby}
    columns |= {metadata_column(k): [p.metadata.get(k) for p in points] for k in metadata}
    return pa.table(columns, schema=usage_schema(groupby, metadata))


def table_points(table: pa.Table) -> list[Point]:
    """The points of a retrieved table (quantities and prices as ``Decimal``; nulls = absent keys)."""
    out = []
    for row in table.to_pylist():
        out.append(
            Point(
                row[SCOPE],
                row[TYPE],
                row[BEGIN],
                row[END],
                as_decimal(row[QTY]),
                as_decimal(row[PRICE]),
                row[UNIT],
                {
                    k[len(GROUPBY_PREFIX) :]: v
                    for k, v in row.items()
                    if k.startswith(GROUPBY_PREFIX) and v is not None
                },
                {
                    k[len(METADATA_PREFIX) :]: v
                    for k, v in row.items()
                    if k.startswith(METADATA_PREFIX) and v is not None
                },
            )
        )
    return out


# -- the reference model --------------------------------------------------------------------------


def _values(value: Any) -> set[str]:
    return {str(v) for v in value} if isinstance(value, list | tuple | set) else {str(value)}


def model_match(p: Point, filters: Mapping[str, Any] | None, metric_types: Iterable[str] = ()) -> bool:
    """The contract's filter semantics, written directly."""
    types = set(metric_types)
    if types and p.type not in types:
        return False
    for key, value in (filters or {}).items():
        accepted = _values(value)
        if key == TYPE:
            ok = p.type in accepted
        elif key == SCOPE:
            ok = p.scope in accepted
        else:
            ok = p.groupby.get(key) in accepted or p.metadata.get(key) in accepted
        if not ok:
            return False
    return True


def model_retrieve(
    points: list[Point],
    begin: datetime,
    end: datetime,
    filters: Mapping[str, Any] | None = None,
    metric_types: Iterable[str] = (),
) -> list[Point]:
    return [p for p in points if begin <= p.begin and p.end <= end and model_match(p, filters, metric_types)]


_TIME_GROUPBYS = {
    "time-d": "day_of_the_year",
    "time-w": "week_of_the_year",
    "time-m": "month",
    "time-y": "year",
}


def model_total(points: list[Point], query: TotalQuery) -> list[dict[str, Any]]:
    """Every result row of ``query`` (before pagination), sorted as the contract says."""
    keys = list(dict.fromkeys(_TIME_GROUPBYS.get(g, g) for g in query.groupby))
    groups: dict[tuple, dict[str, Any]] = {}
    for p in model_retrieve(points, query.begin, query.end, query.filters, query.metric_types):
        row: dict[str, Any] = {"begin": query.begin, "end": query.end}
        sort_key = []
        for key in keys:
            if key == "time":
                row["begin"], row["end"] = p.begin, p.end
                sort_key += [p.begin, p.end]
            else:
                row[key] = p.type if key == TYPE else p.groupby.get(key, "")
                sort_key.append(row[key])
        acc = groups.setdefault(tuple(sort_key), {**row, "qty": Decimal(0), "rate": Decimal(0)})
        with localcontext(prec=80):  # exact: the default 28 digits would round the sums
            acc["qty"] += p.qty
            acc["rate"] += p.price
    return [groups[k] for k in sorted(groups)]


# -- the suite ------------------------------------------------------------------------------------


#: One scope's points of one period: (type, qty, price, groupby, metadata, unit); ``{scope}`` in a
#: groupby value stands for the scope.
_SAMPLE_POINTS = (
    ("instance", "1", "0.5", {"id": "vm-{scope}", "flavor_name": "m1.small"}, {"os_distro": "ubuntu", "vcpus": "1"},
     "instance"),
    ("instance", "1", "1.25", {"id": "vm-{scope}-big", "flavor_name": ""}, {"os_distro": "windows"}, "instance"),
    ("volume", "10.5", "0.105", {"id": "vol-{scope}", "volume_type": "ssd"}, {}, "GiB"),
)


def sample() -> list[Point]:
    """Two scopes, two types with different label sets, three hourly periods, '' and absent labels."""
    return [
        point(scope, type_, T0 + h * HOUR, qty, price, {k: v.format(scope=scope) for k, v in groupby.items()},
              metadata, unit=unit)
        for h in range(3)
        for scope in ("p1", "p2")
        for type_, qty, price, groupby, metadata, unit in _SAMPLE_POINTS
    ]


class StorageConformance:
    """Subclass as ``Test<Backend>Conformance`` and define the ``make_backend`` fixture."""

    @pytest.fixture
    def storage(self, make_backend: Callable[[], StorageBackend]):
        backend = make_backend()
        backend.init()
        yield backend
        backend.close()

    # -- comparison helpers --------------------------------------------------------------------

    @staticmethod
    def assert_money(storage: StorageBackend, got: Any, expected: Decimal) -> None:
        got = as_decimal(got)
        if storage.capabilities.exact_decimals:
            assert got == expected, f"{got} != {expected}"
        else:
            assert float(got) == pytest.approx(float(expected), rel=1e-9, abs=1e-12)

    def assert_points(self, storage: StorageBackend, table: pa.Table, expected: list[Point]) -> None:
        got = sorted(table_points(table), key=lambda p: (p.key(), p.qty, p.price))
        want = sorted(expected, key=lambda p: (p.key(), p.qty, p.price))
        assert [p.key() for p in got] == [p.key() for p in want]
        for g, w in zip(got, want, strict=True):
            self.assert_money(storage, g.qty, w.qty)
            self.assert_money(storage, g.price, w.price)

    def assert_total(
        self,
        storage: StorageBackend,
        result: TotalResult,
        expected: list[dict[str, Any]],
        offset: int = 0,
        limit: int | None = None,
    ) -> None:
        assert result.total == len(expected)
        page = expected[offset:] if limit is None else expected[offset : offset + limit]
        assert [{k: v for k, v in r.items() if k not in ("qty", "rate")} for r in result.results] == [
            {k: v for k, v in r.items() if k not in ("qty", "rate")} for r in page
        ]
        for g, w in zip(result.results, page, strict=True):
            self.assert_money(storage, g["qty"], w["qty"])
            self.assert_money(storage, g["rate"], w["rate"])

    def everything(
        self, storage: StorageBackend, begin: datetime = JANUARY[0], end: datetime = JANUARY[1], **kwargs: Any
    ) -> pa.Table:
        result = storage.retrieve(begin, end, limit=100_000, **kwargs)
        assert result.total == result.points.num_rows
        return result.points

    # -- write and retrieve --------------------------------------------------------------------

    def test_write_returns_the_points_stored(self, storage):
        assert storage.write(rated_table(sample())) == len(sample())
        assert storage.write(rated_table([])) == 0

    def test_round_trip_keeps_every_column(self, storage):
        points = sample()
        storage.write(rated_table(points))
        table = self.everything(storage)
        self.assert_points(storage, table, points)
        assert table.schema.field(BEGIN).type.tz in ("UTC", "+00:00")
        assert table.schema.field(END).type.tz in ("UTC", "+00:00")

    def test_empty_label_is_not_an_absent_label(self, storage):
        points = [
            point("p1", "instance", T0, groupby={"flavor_name": ""}, metadata={"os": ""}),
            point("p1", "instance", T0, groupby={"id": "x"}, metadata={"other": "y"}),
        ]
        storage.write(rated_table(points))
        got = {p.groupby.get("id"): p for p in table_points(self.everything(storage))}
        assert got[None].groupby["flavor_name"] == "" and got[None].metadata == {"os": ""}
        assert "flavor_name" not in got["x"].groupby and got["x"].metadata == {"other": "y"}

    def test_extreme_decimals_round_trip(self, storage):
        points = [
            point("p1", "instance", T0, "0.000000000000000001", "0.00000000000000000001"),
            point(
                "p1",
                "instance",
                T0,
                "12345678901234567890.123456789012345678",
                "123456789012345678.12345678901234567891",
                groupby={"id": "big"},
            ),
        ]
        storage.write(rated_table(points))
        self.assert_points(storage, self.everything(storage), points)

    def test_label_sets_may_differ_between_writes(self, storage):
        first = [point("p1", "instance", T0, groupby={"flavor_name": "a"}, metadata={"vcpus": "2"})]
        second = [point("p1", "volume", T0, groupby={"volume_type": "ssd"}, metadata={"size": "10"})]
        storage.write(rated_table(first))
        storage.write(rated_table(second))
        self.assert_points(storage, self.everything(storage), first + second)

    # -- idempotence -----------------------------------------------------------------------

    def test_rewriting_a_slice_stores_it_once(self, storage):
        points = sample()
        storage.write(rated_table(points))
        storage.write(rated_table(points))
        self.assert_points(storage, self.everything(storage), points)

    def test_rewrite_with_other_content_replaces_only_that_slice(self, storage):
        points = sample()
        storage.write(rated_table(points))
        old = [p for p in points if (p.scope, p.type, p.begin) == ("p1", "instance", T0)]
        new = [replace(old[0], qty=Decimal(7), price=Decimal(3))]
        storage.write(rated_table(new))
        kept = [p for p in points if p not in old]
        self.assert_points(storage, self.everything(storage), kept + new)

    def test_points_with_the_same_groupby_in_one_frame_are_both_kept(self, storage):
        # A resized server: same groupby, different metadata (CloudKitty-InfluxDB collapses them, `cloudkitty/storage/v2/influx.py:172-193`).
        labels = {"id": "vm1", "flavor_name": "m1.small"}
        points = [
            point("p1", "instance", T0, "1", "2", labels, {"vcpus": "1"}),
            point("p1", "instance", T0, "1", "3", labels, {"vcpus": "2"}),
            point("p1", "instance", T0, "1", "3", labels, {"vcpus": "2"}),
        ]
        storage.write(rated_table(points))
        self.assert_points(storage, self.everything(storage), points)
        total = storage.total(TotalQuery(begin=JANUARY[0], end=JANUARY[1]))
        self.assert_money(storage, total.results[0]["rate"], Decimal(8))

    # -- filters -----------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("filters", "metric_types"),
        [
            ({"id": "vm-p1"}, ()),  # groupby label
            ({"os_distro": "windows"}, ()),  # metadata label
            ({"flavor_name": ""}, ()),  # an empty label is a value
            ({"id": ["vm-p1", "vol-p2"]}, ()),  # list: any of the values
            ({"id": []}, ()),  # empty list: nothing
            ({"project_id": "p2", "os_distro": "ubuntu"}, ()),  # keys are ANDed
            ({"no_such_key": "x"}, ()),
            ({}, ("volume",)),  # metric types
            ({"type": "instance"}, ()),  # type filter = metric types
            ({"type": ["instance", "volume"]}, ("volume",)),  # both must hold
            ({"scope_id": "p2"}, ()),  # the point's scope
            ({"scope_id": ["p1", "p2"], "vcpus": "1"}, ("instance",)),
        ],
    )
    def test_filters(self, storage, filters, metric_types):
        points = sample()
        storage.write(rated_table(points))
        got = self.everything(storage, filters=filters, metric_types=metric_types)
        self.assert_points(storage, got, model_retrieve(points, *JANUARY, filters, metric_types))

    def test_scope_filter_is_the_scope_not_a_label(self, storage):
        points = [point("p1", "instance", T0, groupby={"project_id": "other"})]
        storage.write(rated_table(points))
        assert self.everything(storage, filters={"scope_id": "p1"}).num_rows == 1
        assert self.everything(storage, filters={"scope_id": "other"}).num_rows == 0

    # -- pagination, order and bounds --------------------------------------------------------

    def test_pagination_and_order(self, storage):
        points = [
            point(f"p{s}", t, T0 + h * HOUR, str(s), groupby={"id": f"r{i}"})
            for h in range(3)
            for s in range(3)
            for t in ("b", "a")
            for i in range(2)
        ]
        random.Random(4).shuffle(points)
        storage.write(rated_table(points))
        pages = [storage.retrieve(*JANUARY, offset=offset, limit=10) for offset in (0, 10, 20, 30, 40)]
        assert [p.total for p in pages] == [36] * 5
        assert [p.points.num_rows for p in pages] == [10, 10, 10, 6, 0]
        rows = [p for page in pages for p in table_points(page.points)]
        self.assert_points(storage, rated_table(rows), points)
        order = [(p.begin, p.scope, p.type) for p in rows]
        assert order == sorted(order)
        again = storage.retrieve(*JANUARY, offset=10, limit=10)
        assert table_points(again.points) == table_points(pages[1].points)

    def test_bounds_select_whole_periods(self, storage):
        points = [point("p1", "instance", T0 + h * HOUR, groupby={"id": str(h)}) for h in range(-1, 25)]
        points.append(point("p1", "instance", T0 + 23 * HOUR, groupby={"id": "long"}, length=2 * HOUR))
        storage.write(rated_table(points))
        got = self.everything(storage, T0, T0 + DAY)
        self.assert_points(storage, got, model_retrieve(points, T0, T0 + DAY))
        assert sorted(p.groupby["id"] for p in table_points(got)) == sorted(str(h) for h in range(24))

    def test_default_bounds_are_the_current_month(self, storage):
        start = month_start(datetime.now(UTC))
        this, last = point("p1", "instance", start, "2", "2"), point("p1", "instance", start - HOUR, "1", "1")
        storage.write(rated_table([this, last]))
        self.assert_points(storage, storage.retrieve().points, [this])
        total = storage.total(TotalQuery())
        assert total.results[0]["begin"] == start
        self.assert_money(storage, total.results[0]["rate"], Decimal(2))

    # -- total ---------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "query",
        [
            TotalQuery(),
            TotalQuery(groupby=("type",)),
            TotalQuery(groupby=("project_id",)),
            TotalQuery(groupby=("flavor_name",)),  # missing label groups as ''
            TotalQuery(groupby=("time",)),
            TotalQuery(groupby=("time-d",)),
            TotalQuery(groupby=("time-m", "time-y", "time-w")),
            TotalQuery(groupby=("type", "project_id", "time")),
            TotalQuery(groupby=("type",), filters={"project_id": "p1"}),
            TotalQuery(
                groupby=("id",), filters={"os_distro": ["ubuntu", "windows"]}, metric_types=("instance",)
            ),
            TotalQuery(groupby=("type",), filters={"type": "volume"}),
            TotalQuery(groupby=("time",), filters={"scope_id": "p2"}),
            TotalQuery(groupby=("vcpus",)),  # metadata is not a groupby
        ],
        ids=lambda q: f"{'+'.join(q.groupby) or 'none'}|{q.filters}|{q.metric_types}",
    )
    def test_total(self, storage, query):
        points = sample() + [
            point("p1", "instance", T0 + DAY, "2", "4", {"id": "vm-p1"}, {"os_distro": "ubuntu"})
        ]
        storage.write(rated_table(points))
        query = replace(query, begin=JANUARY[0], end=JANUARY[1])
        self.assert_total(storage, storage.total(query), model_total(points, query))

    def test_total_without_a_match_has_no_row(self, storage):
        storage.write(rated_table(sample()))
        for query in (
            TotalQuery(begin=T0 + DAY, end=T0 + 2 * DAY),
            TotalQuery(begin=T0, end=T0 + DAY, groupby=("type",), metric_types=("nothing",)),
            TotalQuery(begin=T0, end=T0 + DAY, filters={"id": "nothing"}),
        ):
            assert storage.total(query) == TotalResult(0, [])

    def test_total_results_carry_query_bounds_or_periods(self, storage):
        storage.write(rated_table(sample()))
        plain = storage.total(TotalQuery(begin=T0, end=T0 + DAY, groupby=("type",)))
        assert {(r["begin"], r["end"]) for r in plain.results} == {(T0, T0 + DAY)}
        timed = storage.total(TotalQuery(begin=T0, end=T0 + DAY, groupby=("time",)))
        assert [(r["begin"], r["end"]) for r in timed.results] == [
            (T0 + h * HOUR, T0 + (h + 1) * HOUR) for h in range(3)
        ]

    def test_total_pagination(self, storage):
        points = sample()
        storage.write(rated_table(points))
        query = TotalQuery(begin=JANUARY[0], end=JANUARY[1], groupby=("id",))
        expected = model_total(points, query)
        assert len(expected) == 6
        for offset, limit in ((0, 4), (4, 4), (2, 3), (6, 2)):
            result = storage.total(replace(query, offset=offset, limit=limit))
            self.assert_total(storage, result, expected, offset, limit)

    def test_total_money_is_exact(self, storage):
        points = [
            point("p1", "instance", T0 + h * HOUR, q, q, {"id": f"{h}-{q}"})
            for h in range(10)
            for q in ("0.1", "0.2")
        ]
        storage.write(rated_table(points))
        result = storage.total(TotalQuery(begin=T0, end=T0 + DAY))
        self.assert_money(storage, result.results[0]["qty"], Decimal(3))
        self.assert_money(storage, result.results[0]["rate"], Decimal(3))
        if storage.capabilities.exact_decimals:
            assert isinstance(result.results[0]["qty"], Decimal) and result.results[0]["qty"] == 3

    def test_total_custom_fields(self, storage):
        if storage.capabilities.supports_custom_fields:
            pytest.skip("custom_fields are backend specific")
        with pytest.raises(ValueError, match="custom_fields"):
            storage.total(TotalQuery(custom_fields="SUM(qty) AS qty"))

    # -- delete --------------------------------------------------------------------------------

    @pytest.fixture
    def deletable(self, storage):
        if not storage.capabilities.supports_delete:
            pytest.skip(f"{storage.capabilities.name} does not support delete")
        points = [
            point(s, t, T0 + h * HOUR, groupby={"id": f"{s}-{i}", t: "x"}, metadata={"m": str(i), t: "y"})
            for s in ("p1", "p2")
            for t in ("instance", "volume")
            for h in range(4)
            for i in range(2)
        ]
        storage.write(rated_table(points))
        return storage, points

    def test_delete_range_is_half_open_on_the_begin(self, deletable):
        storage, points = deletable
        storage.delete(T0 + HOUR, T0 + 3 * HOUR)
        self.assert_points(
            storage, self.everything(storage), [p for p in points if not T0 + HOUR <= p.begin < T0 + 3 * HOUR]
        )

    @pytest.mark.parametrize("filters", [{"scope_id": "p1"}, {"project_id": "p1"}])
    def test_delete_with_a_scope_filter_keeps_other_scopes(self, deletable, filters):
        storage, points = deletable
        storage.delete(T0 + HOUR, T0 + 2 * HOUR, filters)
        self.assert_points(
            storage,
            self.everything(storage),
            [p for p in points if not (p.scope == "p1" and p.begin == T0 + HOUR)],
        )

    def test_delete_without_end_removes_everything_after_begin(self, deletable):
        storage, points = deletable
        storage.delete(T0 + 2 * HOUR, None, {"scope_id": "p2"})
        self.assert_points(
            storage,
            self.everything(storage),
            [p for p in points if not (p.scope == "p2" and p.begin >= T0 + 2 * HOUR)],
        )

    @pytest.mark.parametrize(
        "filters",
        [
            {"id": "p1-0"},
            {"m": "1"},
            {"type": "volume", "m": ["0", "1"]},
            {"id": []},
            {"type": "volume"},
            {"no_such_key": "x"},
            {"instance": "x", "scope_id": "p2"},
            {"volume": "y"},
        ],
    )
    def test_delete_with_label_filters_removes_only_matching_points(self, deletable, filters):
        storage, points = deletable
        storage.delete(None, None, filters)
        expected = [p for p in points if not model_match(p, filters)]
        self.assert_points(storage, self.everything(storage), expected)

    def test_write_after_delete(self, deletable):
        storage, points = deletable
        storage.delete(None, None)
        assert self.everything(storage).num_rows == 0
        storage.write(rated_table(points[:3]))
        self.assert_points(storage, self.everything(storage), points[:3])

    # -- everything against the model ----------------------------------------------------------

    @staticmethod
    def random_points(rng: random.Random, n: int) -> list[Point]:
        """Points with label sets varying per point (so stored label columns differ)."""
        labels = {"id": ["a", "b", "c", ""], "flavor_name": ["s", "m", ""], "zone": ["z1", "z2"]}
        meta = {"os": ["linux", "windows", ""], "id": ["a", "x"]}
        points = []
        for _ in range(n):
            groupby = {k: rng.choice(v) for k, v in labels.items() if rng.random() < 0.7}
            metadata = {k: rng.choice(v) for k, v in meta.items() if rng.random() < 0.5}
            qty = Decimal(rng.randint(0, 10**6)).scaleb(-rng.randint(0, 18))
            price = Decimal(rng.randint(0, 10**9)).scaleb(-rng.randint(0, 20))
            points.append(
                point(
                    rng.choice(["p1", "p2", "p3"]),
                    rng.choice(["cpu", "ram", "disk"]),
                    T0 + rng.randint(0, 71) * HOUR,
                    qty,
                    price,
                    groupby,
                    metadata,
                )
            )
        return points

    @staticmethod
    def random_filters(rng: random.Random) -> dict[str, Any]:
        filters: dict[str, Any] = {}
        for key, values in (
            ("id", ["a", "b", "x"]),
            ("os", ["linux", ""]),
            ("scope_id", ["p1", "p3"]),
            ("type", ["cpu", "disk"]),
        ):
            if rng.random() < 0.3:
                filters[key] = rng.sample(values, rng.randint(1, 2))
        return filters

    def test_random_queries_match_the_reference_model(self, storage):
        rng = random.Random(20240101)
        points = self.random_points(rng, 300)
        storage.write(rated_table(points))
        keys = ["type", "time", "time-d", "id", "flavor_name", "zone", "project_id"]
        for _ in range(25):
            filters = self.random_filters(rng)
            begin = T0 + rng.randint(0, 40) * HOUR
            end = begin + rng.randint(1, 40) * HOUR
            metric_types = tuple(rng.sample(["cpu", "ram", "disk"], rng.randint(0, 2)))
            whole = storage.retrieve(begin, end, filters, metric_types, limit=100_000)
            self.assert_points(
                storage, whole.points, model_retrieve(points, begin, end, filters, metric_types)
            )
            limit = rng.randint(1, 15)
            pages = [
                storage.retrieve(begin, end, filters, metric_types, offset, limit)
                for offset in range(0, whole.total + 1, limit)
            ]
            assert {page.total for page in pages} == {whole.total}
            assert [p for page in pages for p in table_points(page.points)] == table_points(whole.points)
            query = TotalQuery(tuple(rng.sample(keys, rng.randint(0, 3))), begin, end, metric_types, filters)
            self.assert_total(storage, storage.total(query), model_total(points, query))

    def test_random_deletes_match_the_reference_model(self, storage):
        if not storage.capabilities.supports_delete:
            pytest.skip(f"{storage.capabilities.name} does not support delete")
        rng = random.Random(7)
        points = self.random_points(rng, 300)
        storage.write(rated_table(points))
        for _ in range(6):
            filters = self.random_filters(rng)
            begin = T0 + rng.randint(0, 60) * HOUR
            end = begin + rng.randint(1, 30) * HOUR
            storage.delete(begin, end, filters)
            points = [p for p in points if not (begin <= p.begin < end and model_match(p, filters))]
            self.assert_points(storage, self.everything(storage), points)
