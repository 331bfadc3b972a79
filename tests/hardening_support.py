"""Helpers of the hardening tests: a prepared workspace, an in-process run, a snapshot.

A refused run must leave the database and the stored data byte-identical: ``snapshot`` is every
row of the SQLite database (``iterdump``) and every stored file's bytes, compared before and after.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.demo import prepare


def prepared(root: Path, **sections: Any) -> Path:
    """The demo's metrics and rules in ``root`` with ``sections`` of ratebeam.yaml replaced, the
    database upgraded and the rules imported (the demo's usage file removed); returns ratebeam.yaml."""
    config = prepare(root)
    (root / "usage.csv").unlink()
    configure(root, **sections)
    assert main(["db", "upgrade", "-c", str(config)]) == 0
    assert main(["rules", "import", "-c", str(config), str(root / "rules.json")]) == 0
    return config


def one_sample(root: Path) -> Path:
    """A prepared workspace in ``root`` rating scope p1, whose usage is one instance sample; returns ``root``."""
    prepared(root, fetcher={"backend": "source", "scopes": ["p1"]})
    (root / "usage.csv").write_text(
        "metric,timestamp,value,project_id,id\nopenstack_nova_server_status,2026-01-01T00:30:00Z,1,p1,vm-1\n")
    return root


def configure(ws: Path, **sections: Any) -> None:
    """Replace ``sections`` of the workspace's ratebeam.yaml."""
    config = ws / "ratebeam.yaml"
    doc = yaml.safe_load(config.read_text())
    doc.update(sections)
    config.write_text(yaml.safe_dump(doc))


def copied(template: Path, tmp_path: Path) -> Path:
    """A private copy of the workspace directory ``template``; returns the copy's directory."""
    shutil.copytree(template, tmp_path / "ws")
    return tmp_path / "ws"


def snapshot(ws: Path) -> tuple[list[str], dict[str, bytes]]:
    """Every row of the workspace's database and every stored file under ``rated/``."""
    conn = sqlite3.connect(ws / "ratebeam.db")
    try:
        rows = list(conn.iterdump())
    finally:
        conn.close()
    root = ws / "rated"
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
    return rows, {str(p.relative_to(ws)): p.read_bytes() for p in files}


def query(ws: Path, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on the workspace's database."""
    conn = sqlite3.connect(ws / "ratebeam.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def run(ws: Path, capsys: pytest.CaptureFixture[str], now: str) -> tuple[int, str]:
    """``ratebeam run`` in this process; its exit status and what it printed: the log (stderr), then its summary (stdout)."""
    capsys.readouterr()
    status = main(["run", "-c", str(ws / "ratebeam.yaml"), "--now", now])
    printed = capsys.readouterr()
    return status, printed.err + printed.out


def one_line(err: str) -> str:
    """The one ``ratebeam: ...`` line of a stopped run (there must be exactly one, and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("ratebeam: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]
