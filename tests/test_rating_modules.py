"""The rating module chain (`cloudkitty/orchestrator.py:257-265`): enabled modules only, priority descending and stable (0 reads as
1), each module's output feeding the next, hashmap adding to the incoming price, failed frames
reported once and left out of the following modules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import polars as pl
import pytest

from ratebeam.pipelines.interchange import parse_usage
from ratebeam.transforms.rating_modules import RatingModule, apply_chain, ordered
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule
from ratebeam.transforms.scripted import load_script

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def batch() -> pl.DataFrame:
    points = [
        {"type": "vm", "qty": "2", "scope": "p1", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z",
         "groupby": {"n": "4"}},
        {"type": "vm", "qty": "3", "scope": "p2", "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z",
         "groupby": {"n": "x"}},
        {"type": "vol", "qty": "10", "scope": "p1", "begin": "2024-01-01T00:00:00Z",
         "end": "2024-01-01T01:00:00Z"},
    ]
    return parse_usage("\n".join(json.dumps(p) for p in points), "usage.jsonl")


def hashmap(name: str, cost: str, priority: int | None = None, enabled: bool = True,
            threshold_field: str | None = None) -> RatingModule:
    thresholds = (ThresholdRule("vm", threshold_field, Decimal(1), "flat", Decimal(0)),) if threshold_field else ()
    rules = RuleSet(services=("vm",), fields=(("vm", threshold_field),) if threshold_field else (),
                    mappings=(MappingRule("vm", None, None, "flat", Decimal(cost)),), thresholds=thresholds)
    return RatingModule(name, "hashmap", enabled=enabled, priority=priority, rules=rules)


def scripted(name: str, expr: str, priority: int | None = None, where: str | None = None) -> RatingModule:
    step = {"set": "price", "expr": expr} | ({"where": where} if where else {})
    return RatingModule(name, "scripted", priority=priority,
                        scripts=(load_script(json.dumps({"name": name, "steps": [step]})),))


def test_order_is_priority_descending_stable_and_zero_or_missing_reads_as_one() -> None:
    modules = [hashmap("a", "1", priority=1), hashmap("b", "1", priority=5), hashmap("c", "1", priority=0),
               hashmap("d", "1"), hashmap("e", "1", priority=5), hashmap("off", "1", priority=9, enabled=False)]
    assert [m.name for m in ordered(modules)] == ["b", "e", "a", "c", "d"]
    assert [m.effective_priority for m in ordered(modules)] == [5, 5, 1, 1, 1]


def test_each_module_feeds_the_next_and_hashmap_adds_to_the_incoming_price() -> None:
    chain = [hashmap("h1", "1", priority=3), hashmap("h2", "10", priority=2), scripted("double", "price * 2")]
    outcome = apply_chain(batch(), chain)
    assert outcome.failures == []
    assert outcome.rated["price"].to_list() == [Decimal(44), Decimal(66), Decimal(0)]  # (1q + 10q) * 2


def test_the_order_decides_what_a_script_sees() -> None:
    before = apply_chain(batch(), [scripted("double", "price * 2", priority=9), hashmap("h", "1")])
    after = apply_chain(batch(), [scripted("double", "price * 2", priority=0), hashmap("h", "1", priority=2)])
    assert before.rated["price"].to_list() == [Decimal(2), Decimal(3), Decimal(0)]
    assert after.rated["price"].to_list() == [Decimal(4), Decimal(6), Decimal(0)]


def test_disabled_modules_and_noop_change_nothing() -> None:
    outcome = apply_chain(batch(), [hashmap("h", "1", enabled=False), RatingModule("noop", "noop")])
    assert outcome.rated.equals(batch())
    assert apply_chain(batch(), []).rated.equals(batch())


def test_a_frame_failed_by_hashmap_is_reported_once_and_skipped_by_later_modules() -> None:
    chain = [hashmap("h", "1", priority=2, threshold_field="n"), scripted("plus", "price + 100")]
    outcome = apply_chain(batch(), chain)
    [failure] = outcome.failures
    assert (failure.scope_id, failure.begin) == ("p2", T0)
    assert outcome.rated["scope_id"].to_list() == ["p1", "p1"]
    assert outcome.rated["price"].to_list() == [Decimal(102), Decimal(100)]


def test_a_script_error_fails_only_the_frames_it_fails_on() -> None:
    # 10**20 does not fit decimal(38, 20): only p1's volume point overflows
    chain = [scripted("huge", "CAST(qty AS DECIMAL(38, 0)) * 10000000000000000000", where="type = 'vol'"),
             hashmap("h", "1", priority=0)]
    outcome = apply_chain(batch(), chain)
    [failure] = outcome.failures
    assert failure.scope_id == "p1" and failure.reason.startswith("rating module 'huge': ")
    assert outcome.rated["scope_id"].to_list() == ["p2"]
    assert outcome.rated["price"].to_list() == [Decimal(3)]


def test_modules_need_their_configuration() -> None:
    with pytest.raises(ValueError, match="needs rules"):
        RatingModule("h", "hashmap")
    with pytest.raises(ValueError, match="needs scripts"):
        RatingModule("s", "scripted")
    with pytest.raises(ValueError, match="unknown kind"):
        RatingModule("x", "pyscripts")  # type: ignore[arg-type]
