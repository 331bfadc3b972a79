"""``ratebeam serve`` re-rates what the reprocessing schedules ask, in its ticks, beside the regular cycle."""

from __future__ import annotations

from pipeline_support import NOW, ratebeam, stored_rows
from reprocess_support import after as end_excluded
from reprocess_support import change_rules, job_store, outside, reference, within

from ratebeam.pipelines.cli import main

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

RANGE = {"globex": ("2026-01-02T00:00:00", "2026-01-02T03:00:00")}


def test_a_serve_tick_processes_a_pending_schedule(copy, tmp_path, prism_endpoint):
    before = stored_rows(copy)
    change_rules(copy)
    first, last = RANGE["globex"]
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "globex", "--from", first, "--to", end_excluded(last),
                 "--reason", "serve"]) == 0
    done = ratebeam("serve", "-c", str(copy), "--runner", "PortableRunner",
                    f"--option=--job_endpoint={prism_endpoint}", "--option=--environment_type=LOOPBACK",
                    "--interval", "5", "--now", NOW, "--step", "3600", "--ticks", "1", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    store = job_store(copy)
    assert all(j.finished for j in store.schedules())
    store.engine.dispose()
    after = stored_rows(copy)
    clean = reference(tmp_path / "ref")
    assert within(after, RANGE).equals(within(clean, RANGE))
    assert outside(after, RANGE).equals(outside(before, RANGE))
