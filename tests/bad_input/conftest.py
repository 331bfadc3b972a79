"""The workspaces the bad-input cases start from: the demo with its schema and rules, rated or not."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bad_input.harness import Case, cli
from ratebeam.pipelines.demo import DEMO_NOW, prepare


def _checkpointed(config: Path) -> Path:
    """``config`` once its database is whole in the main file (copies leave the WAL behind)."""
    with contextlib.closing(sqlite3.connect(config.parent / "ratebeam.db")) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return config


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """The demo workspace, its database upgraded and its rules imported (in-process)."""
    config = prepare(tmp_path_factory.mktemp("bad-input") / "ws")
    for argv in (("db", "upgrade", "-c", config), ("rules", "import", "-c", config, config.parent / "rules.json")):
        done = cli(*argv)
        assert done.status == 0, done.err
    return _checkpointed(config)


@pytest.fixture(scope="session")
def rated_template(template, tmp_path_factory):
    """The same workspace with its usage rated once (state and Parquet files to protect)."""
    config = tmp_path_factory.mktemp("bad-input-rated") / "ws" / "ratebeam.yaml"
    shutil.copytree(template.parent, config.parent)
    done = cli("run", "-c", config, "--now", DEMO_NOW.isoformat())
    assert done.status == 0, done.err
    return _checkpointed(config)


def _copy(template: Path, target: Path) -> Path:
    shutil.copytree(template.parent, target, ignore=shutil.ignore_patterns("*-shm", "*-wal"))
    return target / template.name


@pytest.fixture
def workspace_for(request, tmp_path):
    """``workspace_for(case)``: a private copy of the workspace ``case`` needs; returns its ratebeam.yaml."""

    def make(case: Case) -> Path:
        source = request.getfixturevalue("rated_template" if case.rated else "template")
        return _copy(source, tmp_path / "ws")

    return make


# Property-based tests of this package: bounded so the whole set runs in seconds on two cores;
# ``HYPOTHESIS_PROFILE=bad-input-long`` explores more when there is time.
settings.register_profile("bad-input", max_examples=120, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("bad-input-long", parent=settings.get_profile("bad-input"), max_examples=2000)
