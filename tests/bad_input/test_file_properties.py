"""Any usage file the file collector reads: the reference samples or one ``FatalConnectorError`` naming the file.

Hypothesis writes JSONL and CSV files of a few samples whose cells are good values or arbitrary
ones (any JSON value in JSONL, any text in CSV) and hands them to ``FileCollector.check`` through
fsspec's memory filesystem.  The collector either refuses the file with its one error type, the
message starting ``file collector: <the file>``, or reads every sample with the value the
reference reads (``Decimal`` of the number's text at the quantity's 18 places, NaN and infinities
set apart) and the metric and scope id as written — never another exception.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from decimal import Decimal, InvalidOperation

import fsspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ratebeam.connectors.collectors.file.collector import FileCollector
from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.transforms.schema import quantize_qty

PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "bad-input"))
_NAMES = itertools.count()

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.sampled_from(["", " ", "1", "-2.5", "1e3", "NaN", "-Inf", "abc", "9" * 60,
                                      "2026-01-01T00:30:00Z", "2026-01-01 00:30:00", "9999-12-31T23:59:59-23:59"]))
_ANY = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                      st.dictionaries(st.text(max_size=3), inner, max_size=2)),
                    max_leaves=4)
_GOOD = {"metric": st.sampled_from(["cpu", "ram"]),
         "timestamp": st.sampled_from(["2026-01-01T00:30:00Z", "2026-01-01T01:00:00+01:00", "2026-01-01 02:00:00"]),
         "value": st.one_of(st.integers(0, 10**6), st.decimals(0, 10**6, places=3).map(str)),
         "project_id": st.sampled_from(["p1", "p2"]), "id": st.sampled_from(["vm-1", "vm-2"])}


def _sample(cell: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """A sample whose every field is a good value or, now and then, ``cell``."""
    return st.fixed_dictionaries({key: st.one_of(good, good, good, cell) for key, good in _GOOD.items()})


def _written(name: str, data: bytes) -> str:
    url = f"memory://bad-input-properties/{next(_NAMES)}/{name}"
    with fsspec.open(url, "wb") as fh:
        fh.write(data)
    return url


def _reference_value(value: object) -> Decimal | None:
    """The value a sample holds (``None``: NaN or infinite, no sample), or ``InvalidOperation``."""
    number = Decimal(str(value).strip())
    return quantize_qty(number) if number.is_finite() else None


def _check(url: str, samples: list[dict]) -> None:
    collector = FileCollector(url)
    try:
        collector.check()
    except FatalConnectorError as error:
        assert error.reason.startswith("file collector: ") and url.removeprefix("memory://") in error.reason, \
            error.reason
        return
    frame = collector._loaded()._in_memory  # every sample read, held in memory (far fewer than spill_rows)
    assert frame is not None and frame.height == len(samples)
    by_id = {(row["metric"], row["project_id"], row["value"], row["__not_finite"]) for row in frame.iter_rows(named=True)}
    for sample in samples:
        try:
            expected = _reference_value(sample["value"])
        except (InvalidOperation, ValueError):
            raise AssertionError(f"read a value the reference refuses: {sample['value']!r}") from None
        key = (str(sample["metric"]), str(sample["project_id"]), expected, expected is None)
        if isinstance(sample["metric"], str) and isinstance(sample["project_id"], str) \
                and not isinstance(sample["value"], bool):
            assert key in by_id, (key, by_id)


@PROFILE
@given(st.lists(_sample(_ANY), min_size=1, max_size=4))
def test_any_jsonl_samples_read_as_the_reference_or_one_error(samples):
    url = _written("usage.jsonl", "".join(json.dumps(s) + "\n" for s in samples).encode())
    _check(url, samples)


@PROFILE
@given(st.lists(_sample(st.text(max_size=8)), min_size=1, max_size=4))
def test_any_csv_samples_read_as_the_reference_or_one_error(samples):
    text = io.StringIO()
    # every cell quoted: Python's csv leaves a lone carriage return unquoted (its line ends are
    # "\n" here), which no CSV reader can tell from a line end (Polars reads "0\r," as "0")
    writer = csv.DictWriter(text, fieldnames=list(_GOOD), lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    writer.writerows(samples)
    url = _written("usage.csv", text.getvalue().encode("utf-8", "surrogatepass"))
    _check(url, [{k: str(v) for k, v in s.items()} for s in samples])
