"""Helpers of the reprocessing tests: the changed rules and usage, the clean reference, the ranges."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import yaml
from pipeline_support import ratebeam, run_cycle, setup_database, stored_rows, workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.jobs import JobStore

REPO = Path(__file__).resolve().parents[1]
_RC = Path(os.environ.get("RATEBEAM_RC", ".rc"))
CK_PYTHON = (_RC if _RC.is_absolute() else REPO / _RC) / "cloudkitty-venv" / "bin" / "python"
CK_SCHEDULE = REPO / "tests" / "cloudkitty" / "ck_schedule.py"
#: Short leases: a killed job's leases expire (its heartbeat stopped) before the rerun.
SHORT_LEASES = {"lease_seconds": 2}


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def after(last: str) -> str:
    """The excluded end (``--to``) of a range whose last period, included, begins at ``last`` (1 h periods)."""
    from datetime import timedelta

    return (t(last) + timedelta(hours=1)).isoformat()


def change_rules(config: Path) -> None:
    """m1.small from 0.02 to 0.05 an hour (acme-web and globex run some), imported as a user would."""
    rules = config.parent / "rules.json"
    rules.write_text(rules.read_text().replace('"m1.small", "type": "flat", "cost": "0.02"',
                                               '"m1.small", "type": "flat", "cost": "0.05"'))
    done = ratebeam("rules", "import", "-c", str(config), str(rules))
    assert done.returncode == 0, done.stderr


def drop_resources(config: Path) -> None:
    """globex at 03:00 on Jan 2: its floating IP (the whole type) and one of its two instances are gone."""
    usage = config.parent / "usage.csv"
    gone = ("2026-01-02T03:30:00Z,1,globex,fip-globex-1", "2026-01-02T03:30:00Z,1,globex,vm-globex-2")
    usage.write_text("".join(line for line in usage.read_text().splitlines(keepends=True)
                             if not any(g in line for g in gone)))


def reference(root: Path, *, rules: bool = True, usage: bool = False) -> pl.DataFrame:
    """The rows a clean workspace stores, rated from scratch with the changed rules/usage."""
    config = workspace(root)
    setup_database(config)
    if rules:
        change_rules(config)
    if usage:
        drop_resources(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    return stored_rows(config)


def within(rows: pl.DataFrame, ranges: dict[str, tuple[str, str]]) -> pl.DataFrame:
    """The rows of each scope whose begin lies in its (first, last) period range, both included."""
    mask = pl.lit(False)
    for scope, (first, last) in ranges.items():
        mask = mask | ((pl.col("scope_id") == scope) & pl.col("begin").is_between(t(first), t(last)))
    return rows.filter(mask)


def outside(rows: pl.DataFrame, ranges: dict[str, tuple[str, str]]) -> pl.DataFrame:
    return rows.join(within(rows, ranges), on=rows.columns, how="anti", nulls_equal=True)


def insert_as_cloudkitty(config: Path, scope: str, start: str, end: str, reason: str) -> None:
    """The row CloudKitty's API stores, made by CloudKitty's own code (skip without its venv)."""
    if not CK_PYTHON.exists():
        pytest.skip(f"CloudKitty 25.0.0 venv missing ({CK_PYTHON}): run bash tests/cloudkitty/setup_venv.sh")
    url = yaml.safe_load(config.read_text())["database_url"].replace("sqlite:///", f"sqlite:///{config.parent}/")
    done = subprocess.run([str(CK_PYTHON), str(CK_SCHEDULE), url, scope, start, end, reason],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def job_store(config: Path) -> JobStore:
    url = yaml.safe_load(config.read_text())["database_url"].replace("sqlite:///", f"sqlite:///{config.parent}/")
    return JobStore(make_engine(url), "project_id", "source", "file")


RANGES = {"globex": ("2026-01-02T00:00:00", "2026-01-02T05:00:00"),
          "acme-web": ("2026-01-02T00:00:00", "2026-01-02T02:00:00")}


def schedule_both_after_a_change(config: Path) -> None:
    """Change rules and usage, then schedule ``RANGES``: globex through ratebeam, acme-web as CloudKitty's API."""
    from ratebeam.pipelines.cli import main

    change_rules(config)
    drop_resources(config)
    first, last = RANGES["globex"]
    assert main(["reprocess", "create", "-c", str(config), "--scope", "globex", "--from", first, "--to", after(last),
                 "--reason", "m1.small price fix"]) == 0
    insert_as_cloudkitty(config, "acme-web", "2026-01-02T00:00:00Z", "2026-01-02T02:00:00Z", "from CloudKitty's API")


def influx_workspace(root: Path, url: str) -> tuple[Path, str]:
    """A demo workspace storing into a fresh database of the InfluxDB at ``url``; (ratebeam.yaml, database)."""
    database = f"r_{uuid.uuid4().hex[:10]}"
    config = workspace(root, lease_seconds=2)
    doc = yaml.safe_load(config.read_text())
    doc["storage"] = {"backends": [{"backend": "influxdb", "url": url, "database": database}]}
    config.write_text(yaml.safe_dump(doc))
    setup_database(config)
    return config, database
