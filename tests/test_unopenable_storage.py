"""Storage that cannot be opened stops ``ratebeam run`` before it takes any lease.

``s3://`` without s3fs installed, an ``http://`` URL (fsspec reads HTTP but cannot write there) and
a path that is a file used to fail in the write stage's ``setup()``, on a worker, after the scopes
had been leased.  Each backend is now opened and checked by the launcher first: exit 2, one line
naming the storage and the URL, the database and the stored data unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hardening_support import configure, copied, one_line, one_sample, run, snapshot

NOW = "2026-01-01T04:00:00Z"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return one_sample(tmp_path_factory.mktemp("storage") / "ws")


@pytest.mark.parametrize(("url", "says"), [
    ("s3://ratebeam-bucket/rated", "needs s3fs, which is not installed: pip install 'ratebeam[s3]'"),
    ("http://127.0.0.1:1/rated", "storage.backends[0].url: cannot be written to"),
    ("afile", "is a file, not a directory"),
])
def test_storage_that_cannot_be_opened_stops_the_run_before_any_lease(template, tmp_path, capsys, url, says):
    ws = copied(template, tmp_path)
    if url == "afile":
        (ws / "afile").write_text("not a directory\n")
        url = str(ws / "afile")
    configure(ws, storage={"backends": [{"backend": "parquet", "url": url}]})
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
