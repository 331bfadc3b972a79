"""A reprocessing task created through CloudKitty's own API is processed by ``ratebeam run``.

CloudKitty 25.0.0's WSGI app (``servers/cloudkitty_api.py``, noauth) shares the rated demo
workspace's database with ratebeam.  ``POST /v2/task/reprocesses`` runs only database code (its
checks, then a row in ``storage_scope_reprocessing_schedule``), so CloudKitty's transport is
oslo.messaging's in-process ``fake:/`` driver and no broker is started.  After a price change the
task is created and listed through the API, ``ratebeam run`` re-rates its periods after its (empty)
regular cycle, and the API then reports it finished as CloudKitty's processor would leave it:
``current_reprocess_time`` equal to ``end_reprocess_time``.

The client's requests (the same paths and body keys) go to the API directly here; the real
``cloudkitty tasks reprocessing create/get`` are driven by ``test_cloudkitty_client.py``.
"""

from __future__ import annotations

import polars as pl
import pytest
import requests
from pipeline_support import run_cycle, stored_rows
from reprocess_support import change_rules, outside, reference, t, within
from servers.cloudkitty_api import cloudkitty_api

FIRST, LAST = "2026-01-02T00:00:00", "2026-01-02T05:00:00"
RANGES = {"globex": (FIRST, LAST), "acme-web": (FIRST, LAST)}


@pytest.mark.cloudkitty
def test_a_task_created_through_cloudkittys_api_is_processed_by_run(copy, tmp_path):
    before = stored_rows(copy)
    change_rules(copy)
    with cloudkitty_api(copy.parent / "ratebeam.db", "fake:/", tmp_path) as url:
        tasks = f"{url}/v2/task/reprocesses"
        body = {"scope_ids": ["globex", "acme-web"], "start_reprocess_time": f"{FIRST}Z",
                "end_reprocess_time": f"{LAST}Z", "reason": "m1.small price fix"}
        created = requests.post(tasks, json=body, timeout=60)
        assert created.status_code == 202, created.text
        again = requests.post(tasks, json={**body, "scope_ids": ["globex"]}, timeout=60)
        assert again.status_code == 400 and "already has a schedule" in again.text  # CloudKitty sees it pending
        listed = requests.get(tasks, timeout=60)
        assert listed.status_code == 200, listed.text
        pending = {s["scope_id"]: s for s in listed.json()["results"]}
        assert sorted(pending) == ["acme-web", "globex"]
        assert {s["current_reprocess_time"] for s in pending.values()} == {""}

        done = run_cycle(copy)  # nothing due in the regular cycle; the task runs after it
        assert done.returncode == 0, done.stderr
        assert "reprocess: 12/12 period(s) done" in done.stderr

        shown = requests.get(tasks, timeout=60)
        assert shown.status_code == 200, shown.text
        finished = {s["scope_id"]: s for s in shown.json()["results"]}
    assert sorted(finished) == ["acme-web", "globex"]
    for task in finished.values():
        assert task["current_reprocess_time"] == task["end_reprocess_time"] == pending[task["scope_id"]][
            "end_reprocess_time"]
        assert task["reason"] == "m1.small price fix"

    after = stored_rows(copy)
    clean = reference(tmp_path / "ref")  # a workspace rated from scratch with the new price
    assert within(after, RANGES).equals(within(clean, RANGES))
    assert not within(after, RANGES).equals(within(before, RANGES))  # the new price is there
    assert outside(after, RANGES).equals(outside(before, RANGES))  # other periods and scopes untouched
    assert after.height == before.height  # no period stored twice, the end period included
    for scope in RANGES:
        end = after.filter((pl.col("scope_id") == scope) & (pl.col("begin") == t(LAST)))
        assert end.height == within(clean, {scope: (LAST, LAST)}).height > 0
