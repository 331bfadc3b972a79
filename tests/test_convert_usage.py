"""``ConvertUsage``: raw samples of any collector → usage points, in the collector's numeric context."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import apache_beam as beam
import polars as pl
import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to

from ratebeam.pipelines.metrics_config import parse_metrics
from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.convert_usage import ConvertUsage, convert_samples, frame_samples, label_column
from ratebeam.transforms.frames import Frame, FrameOutcome, manifest
from ratebeam.transforms.schema import TIME_ARROW

T0 = datetime(2024, 1, 7, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
METRICS = parse_metrics({"metrics": {
    "cpu": {"unit": "instance", "groupby": ["id"], "mutate": "NUMBOOL"},
    "disk": {"unit": "GiB", "factor": "1/3", "groupby": ["id"], "metadata": ["volume_type"]},
}}, "metrics.yml").metrics
CPU, DISK = METRICS


def _raw(scope: str, metric, values: list[str], **labels: list[str]) -> pa.RecordBatch:
    n = len(values)
    columns = {"scope_id": [scope] * n, "metric": [metric.key] * n, "begin": [T0] * n, "end": [T1] * n,
               "value": values, **{label_column(k): v for k, v in labels.items()}}
    fields = [("scope_id", pa.string()), ("metric", pa.string()), ("begin", TIME_ARROW), ("end", TIME_ARROW),
              ("value", pa.string()), *((label_column(k), pa.string()) for k in labels)]
    return pa.RecordBatch.from_pydict(columns, schema=pa.schema(fields))


def _frame(scope: str, context: NumericContext, value: str = "2") -> pa.RecordBatch:
    return frame_samples([
        _raw(scope, CPU, ["0", value], id=["vm1", "vm2"], project_id=[scope] * 2),
        _raw(scope, DISK, [value], id=["d1"], project_id=[scope], volume_type=["ssd"]),
    ], [Frame(scope, T0)], context)


def test_a_frame_of_several_metrics_becomes_their_usage_points_in_order():
    usage = pl.from_arrow(convert_samples(_frame("p1", NumericContext.EXACT), METRICS))
    assert usage["type"].to_list() == ["cpu", "cpu", "disk"]
    assert usage["qty"].to_list() == [Decimal(0), Decimal(1), (Decimal(2) * Decimal(1 / 3)).quantize(Decimal("1e-18"))]
    assert usage["groupby.id"].to_list() == ["vm1", "vm2", "d1"]
    assert usage["metadata.volume_type"].to_list() == [None, None, "ssd"]
    assert usage["groupby.project_id"].to_list() == ["p1"] * 3 and usage["groupby.year"].to_list() == ["2024"] * 3
    assert set(usage["unit"]) == {"instance", "GiB"} and set(usage["price"]) == {Decimal(0)}


def test_the_numeric_context_recorded_by_the_collect_stage_is_the_one_applied():
    nine = pl.from_arrow(convert_samples(_frame("p1", NumericContext.PROMETHEUS9, "123456789.55"), METRICS))
    exact = pl.from_arrow(convert_samples(_frame("p1", NumericContext.EXACT, "123456789.55"), METRICS))
    assert nine["qty"][2] == Decimal("41152263.3")  # 123456790 * (1/3), 9 digits half-up
    assert exact["qty"][2] == (Decimal("123456789.55") * Decimal(1 / 3)).quantize(Decimal("1e-18"))


def test_a_frame_without_samples_still_travels():
    empty = convert_samples(frame_samples([], [Frame("p1", T0)], NumericContext.EXACT), METRICS)
    assert empty.num_rows == 0 and manifest(empty) == [Frame("p1", T0)]


def test_a_quantity_too_large_fails_its_frame_only():
    huge = "1" + "0" * 30  # times 1/3 does not fit decimal(38, 18)
    with beam.Pipeline(runner="FnApiRunner") as pipeline:
        out = (pipeline | beam.Create([_frame("p1", NumericContext.EXACT), _frame("p2", NumericContext.EXACT, huge)])
               .with_output_types(pa.RecordBatch) | ConvertUsage(METRICS, 1000))
        assert_that(out.usage | beam.FlatMap(manifest), equal_to([Frame("p1", T0)]), label="Converted")
        assert_that(out.failures | beam.Map(lambda o: (o, "disk" in o.reason and "does not fit" in o.reason)),
                    equal_to([(FrameOutcome("p2", T0, False, "convert", _reason(huge)), True)]), label="Failed")


def _reason(huge: str) -> str:
    try:
        convert_samples(_frame("p2", NumericContext.EXACT, huge), METRICS)
    except ValueError as exc:
        return f"convert: ValueError: {exc}"
    raise AssertionError("no failure")


def test_several_frames_convert_at_once_as_they_would_one_by_one():
    """ConvertUsage re-batches a bundle's frames: one conversion per metric, rows in frame order."""
    frames = [_frame(scope, NumericContext.EXACT, value) for scope, value in (("p1", "2"), ("p2", "5"), ("p3", "0"))]
    together = convert_samples(frames, METRICS)
    alone = [pl.from_arrow(convert_samples(f, METRICS)) for f in frames]
    assert pl.from_arrow(together).equals(pl.concat(alone, how="diagonal_relaxed"))  # a frame may have no qty_remainder
    assert manifest(together) == [Frame(s, T0) for s in ("p1", "p2", "p3")]
