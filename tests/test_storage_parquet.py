"""The Parquet backend: the conformance suite on a local directory and on ``memory://``, then what
only this backend promises (layout, escaping, atomic replacement, pruning, exact file types)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage_conformance import (
    DAY,
    HOUR,
    JANUARY,
    T0,
    StorageConformance,
    point,
    rated_table,
    sample,
    table_points,
)

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.storage.base import TotalQuery
from ratebeam.connectors.storage.parquet.backend import ParquetStorage
from ratebeam.transforms.schema import PRICE_ARROW, QTY_ARROW, TIME_ARROW


class TestParquetLocalConformance(StorageConformance):
    @pytest.fixture
    def make_backend(self, tmp_path):
        counter = itertools.count()
        return lambda: ParquetStorage(str(tmp_path / f"store{next(counter)}"))


class TestParquetMemoryConformance(StorageConformance):
    @pytest.fixture
    def make_backend(self):
        roots = []

        def make():
            roots.append(f"memory://ratebeam-{uuid.uuid4().hex}")
            return ParquetStorage(roots[-1])

        yield make
        memory = fsspec.filesystem("memory")
        for root in roots:
            if memory.exists(root):
                memory.rm(root, recursive=True)


@pytest.fixture
def store(tmp_path):
    backend = ParquetStorage(str(tmp_path / "store"))
    backend.init()
    yield backend
    backend.close()


def stored_files(tmp_path):
    root = tmp_path / "store"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_one_file_per_scope_period_and_type(store, tmp_path):
    store.write(rated_table(sample()))
    files = stored_files(tmp_path)
    assert len(files) == 2 * 2 * 3  # scopes x types x periods
    assert "type=instance/scope=p1/20240101T000000Z.parquet" in files
    assert "type=volume/scope=p2/20240101T020000Z.parquet" in files


@pytest.mark.parametrize("scope", ["../x", "a/b", "..", "100%", "é ü", "", "*?[x]", "a\\b"])
def test_scopes_are_escaped_and_cannot_leave_the_root(store, tmp_path, scope):
    points = [point(scope, "instance", T0), point(scope, "../../type", T0)]
    store.write(rated_table(points))
    root = tmp_path / "store"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents]
    assert all(len(p.relative_to(root).parts) == 3 for p in root.rglob("*") if p.is_file())
    got = store.retrieve(*JANUARY, filters={"scope_id": scope})
    assert sorted((p.scope, p.type) for p in table_points(got.points)) == [
        (scope, "../../type"),
        (scope, "instance"),
    ]


def test_files_keep_exact_types(store, tmp_path):
    store.write(rated_table([point("p1", "instance", T0, "0.1", "0.00000000000000000001")]))
    schema = pq.read_schema(tmp_path / "store" / "type=instance/scope=p1/20240101T000000Z.parquet")
    assert schema.field("qty").type == QTY_ARROW
    assert schema.field("price").type == PRICE_ARROW
    assert schema.field("begin").type == TIME_ARROW


def test_absent_labels_are_left_out_of_a_file(store, tmp_path):
    # One batch, two types with different label sets: each file holds only the keys its points have.
    store.write(
        rated_table(
            [
                point("p1", "instance", T0, groupby={"flavor_name": "a"}),
                point("p1", "volume", T0, groupby={"volume_type": "ssd"}),
            ]
        )
    )
    names = pq.read_schema(tmp_path / "store" / "type=volume/scope=p1/20240101T000000Z.parquet").names
    assert "groupby.volume_type" in names and "groupby.flavor_name" not in names


def test_interleaved_slices_are_grouped(store):
    points = [
        point(s, t, T0 + h * HOUR, str(i), groupby={"id": str(i)})
        for i in range(4)
        for h in range(3)
        for s in ("p2", "p1")
        for t in ("b", "a")
    ]
    store.write(rated_table(points))
    got = table_points(store.retrieve(*JANUARY, limit=1000).points)
    assert sorted(p.key() for p in got) == sorted(p.key() for p in points)


def test_a_failed_rewrite_leaves_the_old_file_and_no_temporary(store, tmp_path, monkeypatch):
    store.write(rated_table([point("p1", "instance", T0, "1")]))
    before = stored_files(tmp_path)

    def crash(*args, **kwargs):
        raise OSError("disk vanished")

    monkeypatch.setattr(store._fs, "mv", crash)
    with pytest.raises(Exception, match="disk vanished"):
        store.write(rated_table([point("p1", "instance", T0, "2")]))
    monkeypatch.undo()
    assert stored_files(tmp_path) == before
    assert table_points(store.retrieve(*JANUARY).points)[0].qty == 1


def test_temporary_files_are_never_read(store, tmp_path):
    store.write(rated_table([point("p1", "instance", T0)]))
    directory = tmp_path / "store" / "type=instance" / "scope=p1"
    (directory / ".20240101T010000Z.parquet.abc.tmp").write_bytes(b"half a file")
    (directory / "notes.txt").write_text("not data")
    assert store.retrieve(*JANUARY).total == 1


_KILLED_WRITER = """
import sys
sys.path.insert(0, {tests!r})
from storage_conformance import T0, point, rated_table
from ratebeam.connectors.storage.parquet.backend import ParquetStorage
ParquetStorage({url!r}).write(rated_table([point("p1", "instance", T0, "2")]))
"""


def test_a_killed_writers_temporary_file_is_debris_until_its_slice_is_written_again_or_compacted(store, tmp_path):
    store.write(rated_table([point("p1", "instance", T0, "1"), point("p1", "instance", T0 + HOUR, "1")]))
    script = _KILLED_WRITER.format(tests=str(Path(__file__).parent), url=store.url)
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, "RATEBEAM_FAILPOINT": "parquet-rename"},
                            check=False)
    assert killed.returncode == -signal.SIGKILL
    legacy = tmp_path / "store" / "type=instance" / "scope=p1" / ".20240101T010000Z.parquet.abc.tmp"
    legacy.write_bytes(b"what an older version left")  # beside the file, as writes used to
    (left,) = [p for p in store.debris() if p != str(legacy)]
    assert "/.staging/" in left and len(store.debris()) == 2
    assert table_points(store.retrieve(*JANUARY).points)[0].qty == 1  # the killed write is not seen
    store.write(rated_table([point("p1", "instance", T0, "3")]))  # the killed writer's slice
    assert store.debris() == [str(legacy)]
    assert store.compact()["vacuumed"] == 0  # younger than the retention: maybe a write in flight
    assert store.compact(retention_hours=0) == {"files_before": 2, "files_after": 2, "vacuumed": 1}
    assert store.debris() == []
    assert sorted(p.qty for p in table_points(store.retrieve(*JANUARY).points)) == [1, 3]


def test_queries_prune_by_path_before_reading(store, tmp_path):
    store.write(rated_table(sample()))
    # A broken file elsewhere: any query that opened it would fail.
    for relative in (
        "type=volume/scope=p1/20240101T000000Z.parquet",
        "type=instance/scope=p2/20240101T000000Z.parquet",
        "type=instance/scope=p1/20240101T020000Z.parquet",
    ):
        (tmp_path / "store" / relative).write_bytes(b"not parquet")
    window = (T0 + HOUR, T0 + 2 * HOUR)
    selected = store.retrieve(*window, filters={"scope_id": "p1", "type": "instance"})
    assert selected.total == 2
    total = store.total(
        TotalQuery(begin=window[0], end=window[1], metric_types=("instance",), filters={"scope_id": "p1"})
    )
    assert total.results[0]["rate"] == Decimal("1.75")
    with pytest.raises(FatalConnectorError, match="not a readable file"):
        store.retrieve(*JANUARY)


def test_delete_of_whole_files_does_not_read_them(store, tmp_path):
    store.write(rated_table(sample()))
    broken = tmp_path / "store" / "type=volume/scope=p1/20240101T000000Z.parquet"
    broken.write_bytes(b"not parquet")
    store.delete(T0, T0 + HOUR, {"scope_id": "p1"})
    assert not broken.exists()
    assert "type=instance/scope=p2/20240101T000000Z.parquet" in stored_files(tmp_path)


def test_partial_delete_rewrites_the_file(store, tmp_path):
    store.write(rated_table(sample()))
    store.delete(T0, T0 + HOUR, {"os_distro": "windows"})
    left = table_points(store.retrieve(T0, T0 + HOUR, metric_types=("instance",)).points)
    assert sorted(p.metadata["os_distro"] for p in left) == ["ubuntu", "ubuntu"]
    assert len(stored_files(tmp_path)) == 12


def test_sub_second_begin_is_refused(store):
    with pytest.raises(FatalConnectorError, match="fraction of a second"):
        store.write(rated_table([point("p1", "instance", T0 + timedelta(microseconds=5))]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.drop_columns(["price"]), "lacks column"),
        (lambda t: t.set_column(4, "qty", pa.array([0.5], pa.float64())), "not an exact decimal"),
        (lambda t: t.set_column(2, "begin", t["begin"].cast(pa.timestamp("us"))), "not an aware timestamp"),
        (lambda t: t.set_column(0, "scope_id", pa.array([None], pa.string())), "null"),
        (lambda t: t.set_column(3, "end", t["begin"]), "end is not after its begin"),
        (lambda t: t.set_column(4, "qty", pa.array([Decimal("1E-25")], pa.decimal128(38, 25))), "'qty'"),
    ],
)
def test_bad_batches_are_refused_clearly(store, change, message):
    with pytest.raises(FatalConnectorError, match=message):
        store.write(change(rated_table([point("p1", "instance", T0)])))


def test_accepts_record_batches_and_other_string_types(store):
    table = rated_table([point("p1", "instance", T0, groupby={"id": "x"})])
    table = table.set_column(
        table.schema.get_field_index("groupby.id"), "groupby.id", table["groupby.id"].cast(pa.large_string())
    )
    assert store.write(table.to_batches()[0]) == 1
    assert store.retrieve(*JANUARY).points.schema.field("groupby.id").type == pa.string()


def test_a_scope_too_long_for_a_file_name_is_fatal(store):
    with pytest.raises(FatalConnectorError, match="cannot write"):
        store.write(rated_table([point("é" * 200, "instance", T0)]))


def test_naive_datetimes_are_refused(store):
    with pytest.raises(ValueError, match="timezone-aware"):
        store.retrieve(T0.replace(tzinfo=None), T0 + DAY)


def test_unknown_protocol_is_a_clear_error():
    with pytest.raises(FatalConnectorError, match="nosuchprotocol"):
        ParquetStorage("nosuchprotocol://bucket/path")


def test_missing_filesystem_package_is_a_clear_error():
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(FatalConnectorError, match=r"not installed.*ratebeam\[s3\]"):
            ParquetStorage("s3://bucket/path")
    else:
        pytest.skip("s3fs is installed")
