"""The Delta Lake backend: the conformance suite on a local table, then what only this backend
promises (one commit per write, files per write not per slice, exact file types, compaction and
vacuum, concurrent writers on different scopes, quoting of any scope)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pyarrow.dataset as ds
import pytest
from delta_support import assert_concurrent_writers_all_land
from deltalake import DeltaTable
from storage_conformance import (
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
from ratebeam.connectors.storage.delta.backend import DeltaStorage
from ratebeam.transforms.schema import PRICE_ARROW, QTY_ARROW, TIME_ARROW


class TestDeltaLocalConformance(StorageConformance):
    @pytest.fixture
    def make_backend(self, tmp_path):
        counter = itertools.count()
        return lambda: DeltaStorage(str(tmp_path / f"store{next(counter)}"))


@pytest.fixture
def store(tmp_path):
    backend = DeltaStorage(str(tmp_path / "store"), compact_files=0)
    backend.init()
    yield backend
    backend.close()


def data_files(tmp_path):
    return sorted(p for p in (tmp_path / "store").glob("*.parquet"))


def test_one_write_is_one_commit_and_one_file_whatever_its_slices(store, tmp_path):
    store.write(rated_table(sample()))  # 2 scopes x 2 types x 3 periods = 12 slices
    table = DeltaTable(store.url)
    assert table.version() == 1  # 0 is the table's creation
    assert len(data_files(tmp_path)) == 1


def test_files_keep_exact_types(store, tmp_path):
    store.write(rated_table([point("p1", "instance", T0, "0.1", "0.00000000000000000001")]))
    schema = ds.dataset(data_files(tmp_path), format="parquet").schema
    assert schema.field("qty").type == QTY_ARROW
    assert schema.field("price").type == PRICE_ARROW
    assert schema.field("begin").type == TIME_ARROW
    got = table_points(store.retrieve(*JANUARY).points)[0]
    assert got.price == Decimal("0.00000000000000000001")


@pytest.mark.parametrize("scope", ["../x", "it's", 'a"b', "100%", "é ü", "", "a\\b", "x' OR '1'='1"])
def test_any_scope_is_quoted_in_predicates(store, scope):
    store.write(rated_table([point(scope, "instance", T0, "1"), point("other", "instance", T0, "5")]))
    store.write(rated_table([point(scope, "instance", T0, "2")]))  # replaces only that slice
    got = sorted((p.scope, p.qty) for p in table_points(store.retrieve(*JANUARY).points))
    assert got == sorted([(scope, Decimal(2)), ("other", Decimal(5))])
    store.delete(None, None, {"scope_id": scope})
    assert [p.scope for p in table_points(store.retrieve(*JANUARY).points)] == ["other"]


def test_a_rewrite_removes_the_old_slice_in_the_same_commit(store):
    store.write(rated_table(sample()))
    before = DeltaTable(store.url).version()
    store.write(rated_table([point("p1", "instance", T0, "9")]))
    table = DeltaTable(store.url)
    assert table.version() == before + 1
    operation = table.history(1)[0]
    assert operation["operation"] == "WRITE" and operation["operationParameters"]["mode"] == "Overwrite"
    table.load_as_version(before)  # the version just before: the old slice, whole
    assert table.to_pyarrow_table(filters=[("scope_id", "=", "p1"), ("type", "=", "instance")]).num_rows == 6


def test_compact_merges_files_and_vacuums_the_superseded(store, tmp_path):
    for h in range(12):
        store.write(rated_table([point(s, "instance", T0 + h * HOUR, str(h)) for s in ("p1", "p2")]))
    # Rewrites the first file: its p2 point and the new p1 point land in one new file.
    store.write(rated_table([point("p1", "instance", T0, "100")]))
    assert len(DeltaTable(store.url).file_uris()) == 12
    counts = store.compact(retention_hours=0)
    assert counts["files_before"] == 12 and counts["files_after"] == 1
    assert counts["vacuumed"] == 13  # the 12 compacted files and the one the rewrite superseded
    assert len(data_files(tmp_path)) == 1
    assert store.debris() == []
    total = store.total(TotalQuery(begin=JANUARY[0], end=JANUARY[1]))
    assert total.results[0]["qty"] == sum(range(12)) * 2 + 100


def test_a_write_past_the_threshold_compacts(tmp_path):
    backend = DeltaStorage(str(tmp_path / "store"), compact_files=4, retention_hours=0)
    backend.init()
    for h in range(5):
        backend.write(rated_table([point("p1", "instance", T0 + h * HOUR)]))
    assert len(DeltaTable(backend.url).file_uris()) == 1
    assert backend.retrieve(*JANUARY).total == 5


def test_vacuum_keeps_files_younger_than_the_retention(store, tmp_path):
    store.write(rated_table([point("p1", "instance", T0, "1")]))
    store.write(rated_table([point("p1", "instance", T0, "2")]))  # supersedes the first file
    assert store.compact()["vacuumed"] == 0  # retention 1 h: a reader on the old version still reads it
    assert len(store.debris()) == 1


def test_concurrent_writers_on_different_scopes_all_land(tmp_path):
    assert_concurrent_writers_all_land(str(tmp_path / "store"), scopes=4, hours=8)


def test_writes_no_file_can_hold_append_and_rewrites_replace(store):
    """A write whose scopes and periods no file's statistics cover appends (its cost does not grow with
    the table); one that may meet stored slices replaces them by predicate."""
    def modes() -> list[str]:
        return [h["operationParameters"]["mode"] for h in reversed(DeltaTable(store.url).history())
                if h["operation"] == "WRITE"]

    store.write(rated_table([point("p1", "instance", T0, "1"), point("p2", "instance", T0, "1")]))
    store.write(rated_table([point("p1", "instance", T0 + timedelta(hours=1), "2")]))  # a later period
    store.write(rated_table([point("p3", "instance", T0, "4")]))  # a scope after every stored one
    assert modes() == ["Append", "Append", "Append"]
    store.write(rated_table([point("p1", "volume", T0, "7")]))  # p1's period: stats say it may be there
    store.write(rated_table([point("p1", "instance", T0, "5")]))  # a rewrite of a stored slice
    assert modes()[3:] == ["Overwrite", "Overwrite"]
    got = sorted((p.scope, p.type, p.qty) for p in table_points(store.retrieve(*JANUARY).points))
    assert got == [("p1", "instance", 2), ("p1", "instance", 5), ("p1", "volume", 7), ("p2", "instance", 1),
                   ("p3", "instance", 4)]


def test_sub_second_begins_are_replaced_exactly(store):
    moment = T0 + timedelta(microseconds=5)
    store.write(rated_table([point("p1", "instance", moment, "1"), point("p1", "instance", T0, "3")]))
    store.write(rated_table([point("p1", "instance", moment, "2")]))
    assert sorted(p.qty for p in table_points(store.retrieve(*JANUARY).points)) == [2, 3]


def test_bad_batches_are_refused_naming_the_backend(store):
    with pytest.raises(FatalConnectorError, match="delta storage: rated batch lacks column"):
        store.write(rated_table([point("p1", "instance", T0)]).drop_columns(["price"]))


def test_a_missing_table_is_refused_by_readers(tmp_path):
    with pytest.raises(FatalConnectorError, match="holds no Delta table"):
        DeltaStorage(str(tmp_path / "nothing")).check_readable()


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FatalConnectorError, match="is a file"):
        DeltaStorage(str(tmp_path / "file")).check()


def test_storage_compact_skips_backends_without_files_to_compact(tmp_path, capsys):
    from pipeline_support import workspace

    from ratebeam.pipelines.cli import main

    # a server's storage (never contacted): no files to compact
    config = workspace(tmp_path / "ws", storage={"backends": [{"backend": "influxdb", "url": "http://127.0.0.1:9"}]})
    assert main(["storage", "compact", "-c", str(config)]) == 0
    assert "no configured backend has files to compact" in capsys.readouterr().out
