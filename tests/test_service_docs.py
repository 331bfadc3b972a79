"""docs/runners.md shows the runner configs ratebeam ships and a production example.

These tests keep them equal to the code: every shipped runner config loads (its options checked
against Beam's parser) and is named by the page's table, and the page's Flink-on-Kubernetes example
is the shipped ``flink-k8s.yaml``.  (``ratebeam serve --help`` is in docs/cli.md, generated from the
parser.)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ratebeam.pipelines.runners.config import RunnerConfig, load_runner_config

ROOT = Path(__file__).parents[1]
RUNNERS = (ROOT / "docs" / "runners.md").read_text()
SHIPPED = ("dask.yaml", "direct.yaml", "flink-k8s.yaml", "flink-local.yaml", "flink-session.yaml", "prism-events.yaml",
           "prism.yaml")


def fenced_after(marker: str) -> str:
    """The text of the first fenced block of docs/runners.md after ``marker``."""
    found = re.search(re.escape(marker) + r".*?```[a-z]*\n(.*?)```", RUNNERS, re.DOTALL)
    assert found, f"no fenced block after {marker!r} in docs/runners.md"
    return found.group(1)


def test_every_shipped_runner_config_loads_by_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such file here: the installed one is found
    assert tuple(sorted(p.name for p in (ROOT / "runner_configs").glob("*.yaml"))) == SHIPPED
    for name in SHIPPED:
        assert f"`{name}`" in RUNNERS, name  # the page's table names it
        assert isinstance(load_runner_config(name), RunnerConfig), name


def test_the_production_example_is_the_shipped_flink_k8s_yaml():
    shown = RunnerConfig.model_validate(yaml.safe_load(fenced_after("the\n   shipped `runner_configs/flink-k8s.yaml`")))
    shipped = load_runner_config("flink-k8s.yaml")
    assert shown == shipped
    assert shipped.environment.type == "EXTERNAL" and "--checkpointing_interval=60000" in shipped.runner_options

