"""Frames travel inside Arrow batches; the Arrow IPC coder keeps data, manifest and types exact."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import polars as pl
import pytest

from ratebeam.connectors.sql.state_transforms import Plan, committable_prefix
from ratebeam.transforms import schema
from ratebeam.transforms.arrow_coder import ArrowRecordBatchCoder
from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.convert_usage import numeric_context, with_numeric_context
from ratebeam.transforms.frames import (
    Frame,
    FrameOutcome,
    concat_frames,
    manifest,
    split_frames,
    to_batch,
    with_manifest,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 1, tzinfo=UTC)
T2 = datetime(2026, 1, 1, 2, tzinfo=UTC)


def _usage(scope: str, begin: datetime, qty: str, **labels: str) -> pl.DataFrame:
    return pl.DataFrame(
        {schema.SCOPE: [scope], schema.TYPE: ["instance"], schema.BEGIN: [begin], schema.END: [begin],
         schema.QTY: [Decimal(qty)], schema.PRICE: [Decimal(0)], schema.UNIT: ["instance"],
         **{schema.groupby_column(k): [v] for k, v in labels.items()}},
        schema={**schema.polars_core_schema(), **{schema.groupby_column(k): pl.String for k in labels}},
    )


def test_coder_round_trip_keeps_decimals_and_manifest():
    batch = to_batch(_usage("p1", T0, "0.123456789012345678", flavor="m1"), [Frame("p1", T0), Frame("p2", T0)])
    coder = ArrowRecordBatchCoder()
    decoded = coder.decode(coder.encode(batch))
    assert decoded.equals(batch)
    assert manifest(decoded) == [Frame("p1", T0), Frame("p2", T0)]
    assert pl.from_arrow(decoded)[schema.QTY].to_list() == [Decimal("0.123456789012345678")]
    assert coder.estimate_size(batch) == batch.get_total_buffer_size() >= batch.nbytes
    # A slice of string views (Polars' layout, zero-copy), whose nbytes pyarrow cannot compute.
    views = pl.DataFrame({"s": ["short", "a string longer than twelve bytes"]}).to_arrow(
        compat_level=pl.CompatLevel.newest()).to_batches()[0].slice(1)
    assert coder.estimate_size(views) >= len("a string longer than twelve bytes")
    assert coder.decode(coder.encode(views)).to_pylist() == [{"s": "a string longer than twelve bytes"}]


def test_concat_frames_unions_label_columns_with_nulls_for_absent_keys():
    merged = concat_frames([
        to_batch(_usage("p1", T0, "1", flavor="m1"), [Frame("p1", T0)]),
        to_batch(_usage("p1", T0, "2", volume_type="ssd"), [Frame("p1", T0)]),
    ])
    assert merged["groupby.flavor"].to_list() == ["m1", None]
    assert merged["groupby.volume_type"].to_list() == [None, "ssd"]


@pytest.mark.parametrize("views", [False, True], ids=["strings", "string views"])
def test_a_batch_of_many_frames_is_cut_between_frames_into_batches_of_about_the_rows_asked(views):
    hours = [datetime(2024, 1, 1, h, tzinfo=UTC) for h in range(4)]
    # metric-major, as a collector answering many periods gives them: cpu for every hour, then disk.
    rows = [("cpu", h, i) for h in hours for i in range(3)] + [("disk", h, 9) for h in hours[:2]]
    batch = with_manifest(pl.DataFrame(
        {"scope_id": "p1", "metric": [m for m, _, _ in rows], "begin": [h for _, h, _ in rows],
         "n": [n for _, _, n in rows]},
    ).to_arrow(compat_level=pl.CompatLevel.newest() if views else pl.CompatLevel.oldest()).to_batches()[0],
        [Frame("p1", h) for h in [*hours, datetime(2024, 1, 1, 5, tzinfo=UTC)]])

    batch = with_numeric_context(batch, NumericContext.PROMETHEUS9)

    parts = split_frames(batch, 5)

    assert all(numeric_context(p) is NumericContext.PROMETHEUS9 for p in parts)  # the metadata goes along

    assert [p.num_rows for p in parts] == [8, 6]  # hours 0-1 (4 + 4 rows), then hours 2-3 and the empty hour 5
    assert [sorted(f.begin.hour for f in manifest(p)) for p in parts] == [[0, 1], [2, 3, 5]]
    first = pl.from_arrow(parts[0])
    assert first.rows() == [("p1", "cpu", hours[0], 0), ("p1", "cpu", hours[0], 1), ("p1", "cpu", hours[0], 2),
                            ("p1", "disk", hours[0], 9), ("p1", "cpu", hours[1], 0), ("p1", "cpu", hours[1], 1),
                            ("p1", "cpu", hours[1], 2), ("p1", "disk", hours[1], 9)]
    assert split_frames(batch, 14) == [batch]  # small enough: as it is


def test_commit_advances_over_the_contiguous_prefix_of_written_periods():
    plan = Plan((T0, T1, T2), "owner")
    ok = [FrameOutcome("p", T0, True), FrameOutcome("p", T2, True)]
    failed = FrameOutcome("p", T1, False, "write", "boom")
    assert committable_prefix(plan, [*ok, failed]) == (T0, [failed])
    assert committable_prefix(plan, ok) == (T0, [])  # T1 never acknowledged: stop there
    assert committable_prefix(plan, [*ok, FrameOutcome("p", T1, True)]) == (T2, [])
    assert committable_prefix(plan, [FrameOutcome("p", T0, False, "collect", "x")])[0] is None


def test_the_cycle_graph_encodes_batches_with_the_arrow_coder(tmp_path):
    """Usage and rated batches are typed ``pa.RecordBatch``: Beam must pick the Arrow coder for them."""
    import apache_beam as beam
    from pipeline_support import workspace

    from ratebeam.connectors.sql.state_transforms import StateSettings
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.cycle import build_cycle
    from ratebeam.transforms.chain_rater import ChainRaterFactory
    from ratebeam.transforms.rules import RuleSet

    config = load_config(workspace(tmp_path / "ws"))
    settings = StateSettings(config.database_url, "project_id", "source", "file", "owner", 3600, 2, 10, 60)
    pipeline = beam.Pipeline(runner="FnApiRunner")
    build_cycle(pipeline | beam.Create([T0]), config, ChainRaterFactory(RuleSet(), (), (), config.metrics), settings)
    proto = pipeline.to_runner_api()
    coders = {pc.unique_name: pc.coder_id for pc in proto.components.pcollections.values()}
    # Main outputs of the collect and rate steps (tagged outputs end with their tag instead).
    batch_outputs = [n for n in coders if n.endswith(".None") and ("CollectUsage/" in n or "Rate/" in n)]
    assert len(batch_outputs) == 2, coders
    for name in batch_outputs:
        assert "ArrowRecordBatchCoder" in coders[name], (name, coders[name])


def _coder_names(components, coder_id: str) -> set[str]:
    """Every coder id inside ``coder_id`` (itself and its components, recursively)."""
    names = {coder_id}
    for child in components.coders[coder_id].component_coder_ids:
        names |= _coder_names(components, child)
    return names


def test_every_batch_of_the_batched_graph_is_arrow_encoded(tmp_path):
    """Batched Prometheus collection adds its own stages; the batches they pass on (inside their
    keyed parts too) and the converted usage are still Arrow IPC, never pickle."""
    import json

    import apache_beam as beam
    import yaml
    from pipeline_support import workspace

    from ratebeam.connectors.sql.state_transforms import StateSettings
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.cycle import build_cycle
    from ratebeam.transforms.chain_rater import ChainRaterFactory
    from ratebeam.transforms.rules import RuleSet

    path = workspace(tmp_path / "ws")
    doc = yaml.safe_load(path.read_text())
    doc["collector"] = {"backend": "prometheus", "url": "http://127.0.0.1:1/api/v1", "batched": True}
    path.write_text(json.dumps(doc))
    (path.parent / "metrics.yml").write_text(json.dumps({"metrics": {"up": {"unit": "u", "groupby": ["id"]}}}))
    config = load_config(path)
    settings = StateSettings(config.database_url, "project_id", "source", "prometheus", "owner", 3600, 2, 10, 60)
    pipeline = beam.Pipeline(runner="FnApiRunner")
    build_cycle(pipeline | beam.Create([T0]), config, ChainRaterFactory(RuleSet(), (), (), config.metrics), settings)
    components = pipeline.to_runner_api().components
    coders = {pc.unique_name: pc.coder_id for pc in components.pcollections.values()}
    steps = ("Batched/QueryAllScopes", "Batched/ByFrame", "Batched/AssembleFrames", "ConvertUsage/", "Rate/")
    carriers = {step: [n for n in coders if step in n and n.endswith(".None")] for step in steps}
    assert all(carriers.values()), carriers
    for name in (n for names in carriers.values() for n in names):
        assert any("ArrowRecordBatchCoder" in c for c in _coder_names(components, coders[name])), (name, coders[name])


def test_written_frames_are_acknowledged_with_their_points(tmp_path):
    """``FrameOutcome.points``: an ok outcome says how many points of its frame the writer stored."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from ratebeam.connectors.storage.parquet.config import ParquetStorageConfig
    from ratebeam.connectors.storage.write_transform import WriteToStorage

    rows = pl.concat([_usage("p1", T0, "1"), _usage("p1", T0, "2"), _usage("p2", T0, "3")]).with_columns(
        pl.lit(T1).cast(schema.TIME_POLARS).alias(schema.END))
    batch = to_batch(rows, [Frame("p1", T0), Frame("p2", T0), Frame("p3", T0)])  # p3: a frame without data
    storage = (ParquetStorageConfig(url=str(tmp_path / "rated")),)
    with beam.Pipeline(runner="FnApiRunner") as pipeline:
        written = (pipeline | beam.Create([batch]) | WriteToStorage(storage)).outcomes
        assert_that(written, equal_to([FrameOutcome("p1", T0, True, points=2), FrameOutcome("p2", T0, True, points=1),
                                       FrameOutcome("p3", T0, True, points=0)]))
