"""Many periods of a scope in one collector call: the same samples as one call per period.

The collect stage groups a bundle's frames by scope for a collector that ``collects_periods`` (the
file collector): one call per scope × metric instead of one per frame.  These tests hold it to the
per-period answer, sample for sample, and check the stage's fallback: a grouped call that fails
for one bad period is made again period by period, so only that period's frame fails.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from ratebeam.connectors.collectors.collect_transform import FAILURES, _CollectFn
from ratebeam.connectors.collectors.file.collector import FileCollector
from ratebeam.connectors.collectors.file.config import FileCollectorConfig
from ratebeam.connectors.errors import NoDataCollected, RetriableConnectorError
from ratebeam.pipelines.metrics_config import parse_metrics
from ratebeam.transforms.frames import Frame, manifest

T0 = datetime(2024, 1, 7, tzinfo=UTC)
HOUR = timedelta(hours=1)
BEGINS = [T0 + i * HOUR for i in range(6)]

# p1 has cpu samples in hours 0, 1, 3 and 5 (a NaN in hour 3), disk in hour 1 only; p2 in hour 0 only.
CSV = """metric,timestamp,value,project_id,id
cpu,2024-01-07T00:10:00Z,1,p1,vm1
cpu,2024-01-07T00:40:00Z,4,p1,vm1
cpu,2024-01-07T00:20:00Z,2,p1,vm2
cpu,2024-01-07T01:05:00Z,7,p1,vm1
cpu,2024-01-07T03:05:00Z,NaN,p1,vm1
cpu,2024-01-07T03:15:00Z,3,p1,vm2
cpu,2024-01-07T05:59:59Z,8,p1,vm3
disk,2024-01-07T01:30:00Z,5,p1,d1
cpu,2024-01-07T00:30:00Z,5,p2,vm9
"""


def _metrics():
    return parse_metrics({"metrics": {
        "cpu": {"unit": "instance", "groupby": ["id"]},
        "disk": {"unit": "GiB", "groupby": ["id"]},
    }}, "metrics.yml").metrics


@pytest.fixture
def usage_url(memory_file):
    return memory_file("usage.csv", CSV)


def _one_by_one(collector: FileCollector, scope: str, begins: list[datetime], metric) -> list[tuple]:
    rows: list[tuple] = []
    for begin in begins:
        with contextlib.suppress(NoDataCollected):
            rows += pa.Table.from_batches([collector.collect(scope, begin, begin + HOUR, metric)]).to_pylist()
    return rows


@pytest.mark.parametrize("spill_rows", [1_000_000, 1], ids=["in memory", "spilled"])
@pytest.mark.parametrize("begins", [BEGINS, BEGINS[1:4], [BEGINS[0], BEGINS[3], BEGINS[5]]],
                         ids=["all", "adjacent", "with gaps"])
def test_many_periods_in_one_call_are_the_periods_one_by_one(usage_url, spill_rows, begins, tmp_path):
    for metric in _metrics():
        together = FileCollector(usage_url, spill_rows=spill_rows, spill_dir=str(tmp_path))
        apart = FileCollector(usage_url, spill_rows=spill_rows, spill_dir=str(tmp_path))
        try:
            expected = _one_by_one(apart, "p1", begins, metric)
            if not expected:
                with pytest.raises(NoDataCollected, match="no sample for scope p1"):
                    together.collect_periods("p1", begins, 3600, metric)
                continue
            batch = together.collect_periods("p1", begins, 3600, metric)
            assert pa.Table.from_batches([batch]).to_pylist() == expected
        finally:
            together.close()
            apart.close()


class _OneBadPeriod(FileCollector):
    """The file collector, failing (retriably) any call that covers ``BEGINS[2]``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.grouped_calls = 0

    def collect_periods(self, scope_id, begins, period, metric):
        self.grouped_calls += len(begins) > 1  # ``collect`` asks for one period through here too
        if BEGINS[2] in begins:
            raise RetriableConnectorError("HTTP 503 for this period")
        return super().collect_periods(scope_id, begins, period, metric)


def _run_stage(collector: FileCollector, items: list[tuple[str, datetime]]) -> tuple[list, list]:
    """Items through the collect DoFn as one bundle: (sample batches, failure outcomes)."""
    fn = _CollectFn(FileCollectorConfig(url="unused"), tuple(_metrics()), 3600, "project_id")
    fn._collector = collector
    fn._limit = 1024
    fn.start_bundle()
    window = GlobalWindow()
    outputs = [out for item in items for out in fn.process(item, window)]
    outputs += [out.value if isinstance(out, WindowedValue) else out for out in fn.finish_bundle()]
    failures = [out.value for out in outputs if getattr(out, "tag", None) == FAILURES]
    failures = [f.value if isinstance(f, WindowedValue) else f for f in failures]
    return [out for out in outputs if isinstance(out, pa.RecordBatch)], failures


def test_the_stage_asks_once_per_scope_and_metric_and_carries_every_frame(usage_url):
    collector = FileCollector(usage_url)
    items = [(scope, begin) for begin in BEGINS for scope in ("p2", "p1")]  # interleaved, as a shuffle may
    batches, failures = _run_stage(collector, items)
    assert not failures
    assert len(batches) == 2  # one per scope
    frames = sorted(f for b in batches for f in manifest(b))
    assert frames == sorted(Frame(s, b) for s, b in items)  # frames without samples travel too
    p1 = next(b for b in batches if Frame("p1", T0) in manifest(b))
    expected = [row for m in _metrics() for row in _one_by_one(FileCollector(usage_url), "p1", BEGINS, m)]
    assert pa.Table.from_batches([p1]).replace_schema_metadata(None).to_pylist() == expected


def test_a_grouped_call_that_fails_is_made_again_period_by_period(usage_url):
    collector = _OneBadPeriod(usage_url)
    batches, failures = _run_stage(collector, [("p1", begin) for begin in BEGINS])
    assert collector.grouped_calls == 1  # the first metric's failed; no other grouped call was made
    assert [(f.scope_id, f.begin, f.stage) for f in failures] == [("p1", BEGINS[2], "collect")]
    assert "HTTP 503" in failures[0].reason
    good = sorted(f for b in batches for f in manifest(b))
    assert good == [Frame("p1", b) for b in BEGINS if b != BEGINS[2]]
