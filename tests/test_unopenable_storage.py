"""Storage that cannot be opened stops ``ratebeam run`` before it takes any lease (issue #18, item 3).

``s3://`` without s3fs installed, an ``http://`` URL (fsspec reads HTTP but cannot write there) and
a path that is a file used to fail in the write stage's ``setup()``, on a worker, after the scopes
had been leased.  Each backend is now opened and checked by the launcher first: exit 2, one line
naming the storage and the URL, the database and the stored data unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hardening_support import copied, one_line, prepared, run, snapshot

NOW = "2026-01-01T04:00:00Z"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("storage") / "ws"
    prepared(root, fetcher={"backend": "source", "scopes": ["p1"]})
    (root / "usage.csv").write_text(
        "metric,timestamp,value,project_id,id\nopenstack_nova_server_status,2026-01-01T00:30:00Z,1,p1,vm-1\n")
    return root


def with_storage(ws: Path, url: str) -> None:
    config = ws / "ratebeam.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["storage"] = {"backends": [{"backend": "parquet", "url": url}]}
    config.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize(("url", "says"), [
    ("s3://ratebeam-bucket/rated", "needs a filesystem package that is not installed"),
    ("http://127.0.0.1:1/rated", "storage.backends[0].url: cannot be written to"),
    ("afile", "is a file, not a directory"),
])
def test_storage_that_cannot_be_opened_stops_the_run_before_any_lease(template, tmp_path, capsys, url, says):
    ws = copied(template, tmp_path)
    if url == "afile":
        (ws / "afile").write_text("not a directory\n")
        url = str(ws / "afile")
    with_storage(ws, url)
    before = snapshot(ws)
    status, err = run(ws, capsys, NOW)
    assert status == 2, err
    line = one_line(err)
    assert (line.startswith("ratebeam: parquet storage: url ") or "ratebeam.yaml: " in line) and url in line, line
    assert says in line, line
    assert "rating due periods" not in err  # refused before the pipeline started
    assert snapshot(ws) == before
    if url.endswith("afile"):
        assert (ws / "afile").read_text() == "not a directory\n"
