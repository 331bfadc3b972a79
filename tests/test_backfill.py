"""``ratebeam backfill``: a new deployment rates its past, resumably, and hands over to the regular cycle."""

from __future__ import annotations

import io
import re
import signal
import time
from datetime import UTC, datetime

import polars as pl
from pipeline_support import NOW, counters, ratebeam, run_cycle, setup_database, stored_rows, workspace

from ratebeam.pipelines.commands.progress import progress

PROGRESS_LINE = re.compile(r"^backfill: \d+/\d+ period\(s\) \(\d+%\), [\d,]+ points/s(, ETA | in )", re.MULTILINE)


def _states(config) -> dict[str, str]:
    done = ratebeam("state", "list", "-c", str(config))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    return {row[0]: row[1] for row in rows}


def _backfill(config, first: str, end: str, env: dict | None = None):
    return ratebeam("backfill", "-c", str(config), "--from", first, "--to", end, "--now", NOW, "--chunk", "8",
                    env=env)


def test_backfill_resumes_after_sigkill_and_the_regular_cycle_continues_after_it(rated, tmp_path):
    clean = stored_rows(rated)  # the demo rated by regular cycles
    config = workspace(tmp_path / "ws", lease_seconds=2)
    setup_database(config)

    # A range that starts after where the regular cycle would begin (Jan 1): rated, state untouched.
    partial = _backfill(config, "2026-01-02T00:00", "2026-01-02T06:00")
    assert partial.returncode == 0, partial.stderr
    assert _states(config) == {}

    crashed = _backfill(config, "2026-01-01T00:00", "2026-01-03T00:00", env={"RATEBEAM_FAILPOINT": "job-commit:6"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    time.sleep(2.5)  # the killed run's leases expire
    resumed = _backfill(config, "2026-01-01T00:00", "2026-01-03T00:00")
    assert resumed.returncode == 0, resumed.stderr
    assert "4 resumed where a former run stopped" in resumed.stderr
    assert "backfill: 152/152 period(s) done" in resumed.stderr  # 4 x 48, less the 5 rounds committed (40)
    assert PROGRESS_LINE.search(resumed.stderr), resumed.stderr  # plain lines: stderr is no terminal
    begin = pl.col("begin")
    assert stored_rows(config).equals(clean.filter(begin < datetime(2026, 1, 3, tzinfo=UTC)))
    # The backfill reached where the regular cycle starts (the month start): the state follows it.
    assert set(_states(config).values()) == {"2026-01-02T23:00:00+00:00"}

    again = _backfill(config, "2026-01-01T00:00", "2026-01-03T00:00")
    assert again.returncode == 0, again.stderr
    assert "backfill: nothing to do" in again.stderr  # re-running skips what was done

    regular = run_cycle(config)
    assert regular.returncode == 0, regular.stderr
    assert counters(regular.stdout)["due"] == 4 * 24  # only Jan 3: nothing rated twice, nothing skipped
    assert stored_rows(config).equals(clean)


def test_a_backfill_behind_the_state_never_moves_it_back(copy):
    before = _states(copy)
    done = _backfill(copy, "2026-01-01T00:00", "2026-01-01T04:00")
    assert done.returncode == 0, done.stderr
    assert _states(copy) == before


def test_backfill_refuses_a_misaligned_or_empty_range(copy):
    for first, end, message in (("2026-01-01T00:10", "2026-01-01T04:00", "not aligned on the 3600 s period"),
                                ("2026-01-01T04:00", "2026-01-01T04:00", "must be after --from")):
        done = _backfill(copy, first, end)
        assert done.returncode == 2
        assert message in done.stderr
        assert "Traceback" not in done.stderr


def test_a_scope_the_fetcher_does_not_list_and_never_rated_is_refused_unless_unlisted(copy):
    """``--scope acme-webb`` (a typo) would rate nothing and exit 0: refused, nothing recorded."""
    before = stored_rows(copy)
    done = ratebeam("backfill", "-c", str(copy), "--from", "2026-01-01T00:00", "--to", "2026-01-01T04:00",
                    "--now", NOW, "--scope", "acme-web", "--scope", "acme-webb")
    assert done.returncode == 2, done.stderr
    assert "backfill: scope(s) acme-webb: not listed by the source fetcher and never rated" in done.stderr
    assert "Traceback" not in done.stderr
    listed = ratebeam("backfill", "-c", str(copy), "--from", "2026-01-01T00:00", "--to", "2026-01-01T04:00",
                      "--now", NOW, "--scope", "acme-webb", "--unlisted")
    assert listed.returncode == 0, listed.stderr
    assert "backfill: 1 scope(s)" in listed.stderr
    assert stored_rows(copy).equals(before)  # acme-webb has no usage: nothing stored either way


def test_progress_lines_say_done_total_rate_and_eta():
    out = io.StringIO()
    with progress(10, "period", desc="backfill", stream=out, interval=0) as shown:
        shown.set(0, 10, points=0)
        shown.set(5, 10, points=500)
    first, second, last = out.getvalue().splitlines()
    assert first.startswith("backfill: 0/10 period(s) (0%), 0 points/s, ETA -")
    assert re.match(r"backfill: 5/10 period\(s\) \(50%\), [\d,]+ points/s, ETA \d+:\d\d:\d\d$", second)
    assert re.match(r"backfill: 5/10 period\(s\) \(50%\), [\d,]+ points/s in [\d.]+ s$", last)
