"""The file collector: samples folded per series and period, converted, labelled like CloudKitty."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import polars as pl
import pytest

from ratebeam.connectors.collectors.file.collector import FileCollector
from ratebeam.connectors.errors import FatalConnectorError, NoDataCollected
from ratebeam.pipelines.metrics_config import parse_metrics
from ratebeam.transforms.conversion import NumericContext
from ratebeam.transforms.convert_usage import convert_samples

T0 = datetime(2024, 1, 7, tzinfo=UTC)  # a Sunday: week_of_the_year "01"
T1 = T0 + timedelta(hours=1)

CSV = """metric,timestamp,value,project_id,id,flavor_name
cpu,2024-01-07T00:10:00Z,1,p1,vm1,m1.tiny
cpu,2024-01-07T00:50:00Z,3,p1,vm1,m1.tiny
cpu,2024-01-07T00:20:00Z,2,p1,vm2,
cpu,2024-01-07T01:00:00Z,9,p1,vm1,m1.tiny
cpu,2024-01-07T00:30:00Z,5,p2,vm3,m1.large
disk,2024-01-07T00:30:00Z,2147483648,p1,d1,
"""


def _metrics(aggregation: str = "max"):
    return parse_metrics(
        {"metrics": {
            "cpu": {"unit": "instance", "groupby": ["id"], "metadata": ["flavor_name", "os_distro"],
                    "extra_args": {"aggregation_method": aggregation}},
            "disk": {"unit": "GiB", "alt_name": "disk.size", "factor": "1/1073741824", "groupby": ["id"]},
        }},
        "metrics.yml",
    )


@pytest.fixture
def usage_url(memory_file):
    return memory_file("usage.csv", CSV)


def _collect(url: str, scope: str, metric_key: str, aggregation: str = "max") -> pl.DataFrame:
    metrics = _metrics(aggregation)
    metric = next(m for m in metrics.metrics if m.name == metric_key)
    collector = FileCollector(url)
    usage = convert_samples(collector.collect(scope, T0, T1, metric), [metric], collector.numeric_context)
    return pl.from_arrow(usage).sort("groupby.id")


def test_samples_are_folded_per_series_within_the_half_open_period(usage_url):
    usage = _collect(usage_url, "p1", "cpu")
    # vm1: max(1, 3); the 01:00 sample belongs to the next period.  vm2: 2.
    assert usage["groupby.id"].to_list() == ["vm1", "vm2"]
    assert usage["qty"].to_list() == [Decimal(3), Decimal(2)]
    assert usage["scope_id"].to_list() == ["p1", "p1"]
    assert usage["type"].to_list() == ["cpu", "cpu"]
    assert usage["price"].to_list() == [Decimal(0), Decimal(0)]


def test_missing_labels_are_empty_strings_and_time_keys_are_cloudkitty_formatted(usage_url):
    usage = _collect(usage_url, "p1", "cpu")
    assert usage["metadata.flavor_name"].to_list() == ["m1.tiny", ""]  # empty cell
    assert usage["metadata.os_distro"].to_list() == ["", ""]  # column absent from the file
    assert usage["groupby.project_id"].to_list() == ["p1", "p1"]  # scope key appended to groupby
    first = usage.row(0, named=True)
    assert (first["groupby.week_of_the_year"], first["groupby.day_of_the_year"], first["groupby.month"],
            first["groupby.year"]) == ("01", "7", "1", "2024")


@pytest.mark.parametrize(("aggregation", "expected"), [("sum", 4), ("min", 1), ("count", 2), ("last", 3)])
def test_aggregation_methods(usage_url, aggregation, expected):
    assert _collect(usage_url, "p1", "cpu", aggregation)["qty"].to_list()[0] == Decimal(expected)


def test_factor_and_alt_name(usage_url):
    usage = _collect(usage_url, "p1", "disk")
    assert usage["type"].to_list() == ["disk.size"]
    assert usage["qty"].to_list() == [Decimal(2)]
    assert usage["unit"].to_list() == ["GiB"]


def test_no_data_for_a_scope_or_period(usage_url):
    with pytest.raises(NoDataCollected):
        _collect(usage_url, "p9", "cpu")
    metric = _metrics().metrics[1]
    with pytest.raises(NoDataCollected):
        FileCollector(usage_url).collect("p2", T0, T1, metric)


def test_bad_files_are_fatal_and_named(tmp_path):
    bad = tmp_path / "usage.csv"
    bad.write_text("metric,timestamp,value,project_id\ncpu,2024-01-07T00:10:00Z,lots,p1\n")
    with pytest.raises(FatalConnectorError, match="usage.csv: value: not a number: 'lots'"):
        FileCollector(str(bad)).collect("p1", T0, T1, _metrics().metrics[0])
    with pytest.raises(FatalConnectorError, match="does not exist"):
        FileCollector(str(tmp_path / "nope")).collect("p1", T0, T1, _metrics().metrics[0])


def test_the_collector_returns_raw_samples_and_declares_its_numeric_context(usage_url):
    """Collecting is only collecting: the folded value as read, before factor / offset / mutate."""
    disk = _metrics().metrics[1]
    collector = FileCollector(usage_url)
    raw = pl.from_arrow(collector.collect("p1", T0, T1, disk))
    assert raw.columns == ["scope_id", "metric", "begin", "end", "value", "label.id", "label.project_id"]
    assert raw.rows() == [("p1", disk.key, T0, T1, Decimal(2147483648), "d1", "p1")]
    assert collector.numeric_context is NumericContext.EXACT
