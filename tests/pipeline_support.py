"""Helpers for the end-to-end tests: a demo-like workspace, the CLI as a subprocess, stored rows."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import yaml

from ratebeam.pipelines.demo import DEMO_NOW, prepare

NOW = DEMO_NOW.isoformat()
RATEBEAM = [sys.executable, "-m", "ratebeam.pipelines.cli"]
#: Bounds holding every point a test stores.
EVER = (datetime(1970, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def workspace(root: Path, database_url: str | None = None, **overrides) -> Path:
    """The demo's data and config in ``root``, optionally on another database; returns ratebeam.yaml."""
    config = prepare(root)
    doc = yaml.safe_load(config.read_text())
    if database_url:
        doc["database_url"] = database_url
    doc.update(overrides)
    config.write_text(yaml.safe_dump(doc))
    return config


def ratebeam(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh process (so SIGKILL and concurrency are real)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*RATEBEAM, *args], capture_output=True, text=True, env=full_env, timeout=timeout,
                          check=False)


def setup_database(config: Path) -> None:
    """``db upgrade`` then ``rules import`` of the workspace's rules, as a user would."""
    for args in (("db", "upgrade", "-c", str(config)),
                 ("rules", "import", "-c", str(config), str(config.parent / "rules.json"))):
        done = ratebeam(*args)
        assert done.returncode == 0, done.stderr


def break_rules_of(config: Path, tenant: str = "globex") -> None:
    """Import rules that fail every frame of ``tenant`` with an instance (a threshold on a
    non-numeric field, `cloudkitty/rating/hash/__init__.py:193-199`); ``setup_database``'s rules import fixes them again."""
    import json

    rules = json.loads((config.parent / "rules.json").read_text())
    os_field = rules["services"][0]["fields"][1]
    os_field["thresholds"] = [{"level": "1", "type": "flat", "cost": "1", "group": "license", "tenant_id": tenant}]
    broken = config.parent / "broken-rules.json"
    broken.write_text(json.dumps(rules))
    done = ratebeam("rules", "import", "-c", str(config), str(broken))
    assert done.returncode == 0, done.stderr


def fix_rules_of(config: Path) -> None:
    """The workspace's own rules again (undoes ``break_rules_of``)."""
    done = ratebeam("rules", "import", "-c", str(config), str(config.parent / "rules.json"))
    assert done.returncode == 0, done.stderr


def run_cycle(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return ratebeam("run", "-c", str(config), "--now", NOW, env=env)


def rated_once(config: Path) -> Path:
    """``config``'s workspace with its database set up and its usage rated by one run; returns it."""
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    return config


def stored_rows(config: Path, *, lineage: bool = False) -> pl.DataFrame:
    """Every stored rated point, in a canonical order (what 'the same stored rows' means).

    Read through the first backend's own ``retrieve``, so it works whatever the table format.
    Without ``lineage`` the ``rating_rules`` column is left out: it names the rules by their uuids,
    which differ between two databases given the same rules (docs/lineage.md).
    """
    from ratebeam.connectors.registry import make_backend
    from ratebeam.pipelines.config import load_config

    loaded = load_config(config, metrics=False)
    backend = make_backend(loaded.storage[0], loaded.scope_key)
    try:
        points = backend.retrieve(EVER[0], EVER[1], limit=1 << 40).points
    finally:
        backend.close()
    if points.num_rows == 0:
        return pl.DataFrame()
    frame = pl.from_arrow(points)
    assert isinstance(frame, pl.DataFrame)
    if not lineage:
        frame = frame.drop("rating_rules", strict=False)
    columns = sorted(frame.columns)
    return frame.select(columns).sort(columns, nulls_last=True)


def delta_workspace(root: Path, **overrides) -> Path:
    """``workspace`` storing into a Delta table (``rated/``): the demo's storage, said explicitly."""
    return workspace(root, storage={"backends": [{"backend": "delta", "url": "rated"}]}, **overrides)


def parquet_workspace(root: Path, **overrides) -> Path:
    """``workspace`` storing into the ``parquet`` backend (a file per slice under ``rated/``)."""
    return workspace(root, storage={"backends": [{"backend": "parquet", "url": "rated"}]}, **overrides)


def counters(output: str) -> dict[str, int]:
    """The 'periods: N due, M committed' figures a run prints (on stdout; ``demo`` on stderr)."""
    for line in output.splitlines():
        if line.startswith("periods:"):
            words = line.replace(",", "").replace(";", "").split()
            return {"due": int(words[1]), "committed": int(words[3]), "rated": int(words[-4]),
                    "written": int(words[-2])}
    raise AssertionError(f"no summary line in:\n{output}")


def leaf_parsers(parser: argparse.ArgumentParser):
    """The parser of every runnable sub-command (those without sub-commands of their own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for child in action.choices.values():
            yield from leaf_parsers(child)
