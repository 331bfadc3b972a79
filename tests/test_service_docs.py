"""The README shows what ``ratebeam serve --help`` prints and the runner configs ratebeam ships.

Issue #11 asks for ``serve --help``, the runner configs and the production example in the README;
these tests keep them equal to the code: every shipped runner config loads (its options checked
against Beam's parser), the README's Flink-on-Kubernetes example is the shipped ``flink-k8s.yaml``,
and the README's help block is the help text of this interpreter at 100 columns (regenerate it with
``COLUMNS=100 ratebeam serve --help``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml
from pipeline_support import RATEBEAM

from ratebeam.pipelines.runner_config import RunnerConfig, load_runner_config

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
SHIPPED = ("dask.yaml", "direct.yaml", "flink-k8s.yaml", "flink-local.yaml", "flink-session.yaml", "prism.yaml")


def fenced_after(marker: str) -> str:
    """The text of the first fenced block of the README after ``marker``."""
    found = re.search(re.escape(marker) + r".*?```[a-z]*\n(.*?)```", README, re.DOTALL)
    assert found, f"no fenced block after {marker!r} in README.md"
    return found.group(1)


def test_every_shipped_runner_config_loads_by_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such file here: the installed one is found
    assert tuple(sorted(p.name for p in (ROOT / "runner_configs").glob("*.yaml"))) == SHIPPED
    for name in SHIPPED:
        assert f"`{name}`" in README, name  # the README's table names it
        assert isinstance(load_runner_config(name), RunnerConfig), name


def test_the_readme_production_example_is_the_shipped_flink_k8s_yaml():
    shown = RunnerConfig.model_validate(yaml.safe_load(fenced_after("the\n   shipped `runner_configs/flink-k8s.yaml`")))
    shipped = load_runner_config("flink-k8s.yaml")
    assert shown == shipped
    assert shipped.environment.type == "EXTERNAL" and "--checkpointing_interval=60000" in shipped.runner_options


def test_the_readme_shows_what_serve_help_prints():
    shown = fenced_after("replays and tests.").removeprefix("$ ratebeam serve --help\n")
    printed = subprocess.run([*RATEBEAM, "serve", "--help"], capture_output=True, text=True, check=True,
                             timeout=120, env={**os.environ, "COLUMNS": "100"}).stdout
    assert shown == printed
