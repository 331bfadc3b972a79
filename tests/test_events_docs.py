"""docs/events.md stays true: its examples load with the real loaders, its worked example is the code's."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import yaml
from events_support import INSTANCE, at, rated, rows, worked_example_events

from ratebeam.pipelines.events.config import LifecycleConfig
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.lifecycle import lifecycle_usage
from ratebeam.transforms.events.triggers import TriggerSet

DOC = (Path(__file__).resolve().parents[1] / "docs" / "events.md").read_text()
BLOCKS = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC, re.S) if "..." not in b]


def test_the_yaml_examples_load():
    definitions = next(b for b in BLOCKS if isinstance(b, list) and "event_type" in b[0])
    assert EventDefinitions.from_yaml_data(definitions, "events.md").definitions
    triggers = next(b for b in BLOCKS if isinstance(b, list) and "name" in b[0])
    trigger = TriggerSet.from_yaml_data(triggers, "events.md", {"instance"}).triggers[0]
    assert trigger.fire_delay.total_seconds() == 300
    lifecycle = next(b for b in BLOCKS if isinstance(b, dict) and "instance" in b)
    assert LifecycleConfig.model_validate(lifecycle["instance"]).settings("project_id").price_traits == (
        "flavor_name",)


def test_the_worked_example_table_is_what_the_code_computes():
    table = re.findall(r"^\| (\d\d:\d\d) – \d\d:\d\d \| (m1\.\w+) +\|[^|]*\| +(\d+) \| +\d+ × ([\d.]+) = ([\d.]+)",
                       DOC, re.M)
    assert len(table) == 4
    usage = lifecycle_usage(worked_example_events(), INSTANCE, 3600, at("13:00"))[0]
    assert sorted((b, f, Decimal(q)) for b, f, q, _, _ in table) == sorted(rows(usage))
    prices = {(b.strftime("%H:%M"), f): p for b, f, p in rated(usage).select(
        "begin", "groupby.flavor_name", "price").iter_rows()}
    assert {(b, f): Decimal(p) for b, f, _, _, p in table} == prices
    assert "**2.55**" in DOC and sum(prices.values()) == Decimal("2.55")
