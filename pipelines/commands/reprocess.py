"""``reprocess create|list|cancel|run`` and ``backfill``: re-rate or rate past ranges (``pipelines.jobs``).

``reprocess create`` applies CloudKitty's checks (``api/v2/task/reprocess.py``, `cloudkitty/orchestrator.py:527-631`) and
inserts the same rows as ``POST /v2/task/reprocesses``: a non-blank reason; ``--from`` before
``--to``, whose end is excluded as everywhere on the command line (the row stores CloudKitty's
last period included, ``--to`` minus one period: CloudKitty's inclusive end stays in its API,
which ratebeam serves unchanged); both aligned on the period (the error suggests the aligned window, as
CloudKitty's does); ``--all`` alone or scope ids, each with an active state; both bounds not
after the scope's last processed period; no unfinished schedule of the scope sharing an instant
with the new one.  Every failed check exits 2 and changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import CommandError, integer, load, parse_instant, row_ids
from ratebeam.pipelines.commands.grammar import add_time_range
from ratebeam.pipelines.commands.output import add_format_argument, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.connectors.sql.job_transforms import JobSettings
    from ratebeam.connectors.sql.jobs import JobRange, JobStore
    from ratebeam.connectors.sql.state_store import StateStore
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.jobs import JobsReport

#: Periods of each range rated per round (a crash re-rates at most one round).
DEFAULT_CHUNK = 24


def add_arguments(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``reprocess …`` and ``backfill`` (``command`` is cli's sub-command factory)."""
    group = sub.add_parser("reprocess", help="re-rate stored periods (CloudKitty's reprocessing schedules)")
    rsub = group.add_subparsers(dest="reprocess_command", required=True)
    p = command(rsub, "create", cmd_create, "schedule the re-rating of [--from, --to) (end excluded)")
    scopes = p.add_mutually_exclusive_group(required=True)
    scopes.add_argument("--scope", action="append", help="scope id (repeatable)")
    scopes.add_argument("--all", action="store_true", help="every active scope")
    add_time_range(p, required=True, from_help="first period to re-rate (ISO-8601)",
                   to_help="end of the range, excluded (ISO-8601; CloudKitty's API takes the last period "
                   "included: the schedule stores that)")
    p.add_argument("--reason", required=True, help="why (stored with the schedule)")
    p = command(rsub, "list", cmd_list, "the reprocessing schedules and their progress")
    p.add_argument("--scope", action="append", help="only these scopes (repeatable)")
    add_format_argument(p)
    p = command(rsub, "cancel", cmd_cancel, "delete unfinished schedules (periods already re-rated stay)")
    p.add_argument("ids", nargs="*", type=integer, metavar="ID", help="the schedules to cancel (ids of `reprocess list`)")
    p.add_argument("--scope", action="append", help="every unfinished schedule of this scope (repeatable)")
    _job_options(command(rsub, "run", cmd_run, "re-rate every pending schedule now"))
    p = command(sub, "backfill", cmd_backfill, "rate a past range [--from, --to) for new deployments or metrics")
    add_time_range(p, required=True)
    p.add_argument("--scope", action="append", help="scope id (repeatable; default: every scope the fetcher lists)")
    p.add_argument("--now", help="the instant whose month start a never-rated scope's regular cycle starts at")
    p.add_argument("--unlisted", action="store_true",
                   help="accept a --scope the fetcher does not list and that was never rated (default: refused)")
    _job_options(p)


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk", type=integer, default=DEFAULT_CHUNK,
                   help=f"periods of each range per round: progress is saved after each (default {DEFAULT_CHUNK})")
    p.add_argument("--runner-config", help="a runner_configs/*.yaml file (default: DirectRunner in memory)")


def _aligned(moment: datetime, period: int) -> datetime:
    return moment - timedelta(seconds=moment.timestamp() % period)


def check_window(start: datetime, end: datetime, period: int, *, end_included: bool) -> None:
    """CloudKitty's window checks: order, and alignment on the period (with the window it suggests)."""
    if end < start or (not end_included and end == start):
        raise InputError("command line", "--to", f"must be {'at or ' if end_included else ''}after --from "
                         f"{start.isoformat()}", end.isoformat())
    if start.timestamp() % period or end.timestamp() % period:
        valid_start, valid_end = _aligned(start, period), _aligned(end, period)
        if valid_start == valid_end:
            valid_end += timedelta(seconds=period)
        raise InputError("command line", "--from/--to", f"not aligned on the {period} s period; a valid window "
                         f"near it is {valid_start.isoformat()} .. {valid_end.isoformat()}",
                         f"{start.isoformat()} .. {end.isoformat()}")


def stores(config: RatebeamConfig) -> tuple[StateStore, JobStore]:
    """The scope states and the job schedules of the configuration's (scope_key, fetcher, collector)."""
    from ratebeam.connectors.sql.jobs import JobStore
    from ratebeam.connectors.sql.state_store import StateStore
    from ratebeam.pipelines.commands.common import engine_of

    engine = engine_of(config)
    keys = (config.scope_key, config.fetcher.backend, config.collector.backend)
    return StateStore(engine, *keys), JobStore(engine, *keys)


def cmd_create(args: argparse.Namespace) -> int:
    """``reprocess create``: validate as CloudKitty's API does, then insert one schedule per scope."""
    config = load(args, metrics=False)
    start, end = parse_instant(args.begin, "--from"), parse_instant(args.end, "--to")
    if not args.reason.strip():
        raise InputError("command line", "--reason", "must not be blank (say why the periods are re-rated)",
                         repr(args.reason))
    check_window(start, end, config.period, end_included=False)
    end = end - timedelta(seconds=config.period)  # the schedule stores CloudKitty's last period, included
    states, jobs = stores(config)
    if args.all:
        scopes = sorted(s.scope for s in states.list_states(active=True))
    else:
        scopes = list(dict.fromkeys(args.scope))
    check_schedules(states, jobs, [(scope, start, end) for scope in scopes])
    ids = jobs.add_schedules(scopes, start, end, args.reason.strip())
    for scope, schedule_id in zip(scopes, ids, strict=True):
        print(f"schedule {schedule_id}: scope {scope}, {start.isoformat()} .. "
              f"{(end + timedelta(seconds=config.period)).isoformat()} (end excluded)")
    return EXIT_OK


def check_schedules(states: StateStore, jobs: JobStore, ranges: list[tuple[str, datetime, datetime]]) -> None:
    """CloudKitty's checks of new (scope, start, end included) schedules, ``CommandError`` (exit 2) on the first.

    Each scope has an active state, each end is not after the scope's last processed period, and
    no unfinished schedule of the scope shares an instant with the new range.  ``rules diff
    --apply`` runs them too, before it changes anything.
    """
    from ratebeam.connectors.sql.jobs import overlaps

    active = {s.scope: s for s in states.list_states(active=True)}
    scopes = list(dict.fromkeys(scope for scope, _, _ in ranges))
    unknown = [s for s in scopes if s not in active]
    if unknown or not scopes:
        raise CommandError(f"reprocess create: scope(s) {', '.join(unknown) or '(none: no active scope)'} "
                           "have no active state (never rated, or deactivated); nothing was scheduled",
                           EXIT_BAD_INPUT)
    for scope, _, end in ranges:
        last = active[scope].last_processed
        if last is None or end > last:
            raise CommandError(f"reprocess create: scope {scope}: the range's last period {end.isoformat()} is "
                               f"after its last processed period ({last.isoformat() if last else 'none'}); nothing was scheduled",
                               EXIT_BAD_INPUT)
    others = jobs.schedules(scopes, unfinished=True)
    for scope, start, end in ranges:
        for other in others:
            if other.scope == scope and overlaps(start, end, other.start, other.last):
                raise CommandError(f"reprocess create: scope {scope} already has schedule {other.id} for "
                                   f"{other.start.isoformat()} .. {other.last.isoformat()}, which shares time with "
                                   f"{start.isoformat()} .. {end.isoformat()}; nothing was scheduled",
                                   EXIT_BAD_INPUT)


def _status(job: JobRange) -> str:
    if job.finished:
        return "finished"
    return "pending" if job.current is None else "in progress"


def cmd_list(args: argparse.Namespace) -> int:
    """``reprocess list``: every schedule, its progress and status."""
    config = load(args, metrics=False)
    _, jobs = stores(config)
    rows = [
        {"id": j.id, "scope": j.scope, "start": j.start, "end": j.last + timedelta(seconds=config.period),
         "current": j.current,
         "done": _periods(j, config.period) - j.remaining(config.period), "periods": _periods(j, config.period),
         "status": _status(j), "reason": j.reason}
        for j in jobs.schedules(args.scope)
    ]
    write_rows(rows, ["id", "scope", "start", "end", "current", "done", "periods", "status", "reason"], args.format)
    return EXIT_OK


def _periods(job: JobRange, period: int) -> int:
    return int((job.last - job.start).total_seconds() // period) + 1


def cmd_cancel(args: argparse.Namespace) -> int:
    """``reprocess cancel ID… | --scope S``: delete unfinished schedules; 2 when none matches."""
    if not args.ids and not args.scope:
        raise InputError("command line", "ID/--scope", "name schedules to cancel", "(none)")
    row_ids(args.ids, "ID")
    config = load(args, metrics=False)
    _, jobs = stores(config)
    cancelled = jobs.cancel(args.ids, args.scope)
    if not cancelled:
        raise CommandError("reprocess cancel: no unfinished schedule matches; nothing was cancelled", EXIT_BAD_INPUT)
    for job in cancelled:
        done = "nothing re-rated yet" if job.current is None else f"re-rated up to {job.current.isoformat()}"
        print(f"schedule {job.id} (scope {job.scope}) cancelled; {done}")
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """``reprocess run``: re-rate the pending schedules; 1 when some are left or frames failed."""
    from ratebeam.connectors.sql.job_transforms import JobSettings
    from ratebeam.connectors.sql.jobs import REPROCESS

    config = load(args)
    report = launch_jobs(config, JobSettings(REPROCESS, _chunk(args)), "reprocess", args.runner_config)
    return EXIT_OK if report.ok else EXIT_FAILED


def run_pending_reprocessing(config: RatebeamConfig, runner_config_path: str | None) -> bool:
    """What ``ratebeam run`` does after its cycle: the pending schedules, if any; True when all went well."""
    from ratebeam.connectors.sql.job_transforms import JobSettings
    from ratebeam.connectors.sql.jobs import REPROCESS
    from ratebeam.pipelines.jobs import job_store

    store = job_store(config)
    try:
        if not store.pending_schedules():
            return True
    finally:
        store.engine.dispose()
    return launch_jobs(config, JobSettings(REPROCESS, DEFAULT_CHUNK), "reprocess", runner_config_path).ok


def _chunk(args: argparse.Namespace) -> int:
    if args.chunk < 1:
        raise InputError("command line", "--chunk", "must be at least 1", str(args.chunk))
    return int(args.chunk)


def cmd_backfill(args: argparse.Namespace) -> int:
    """``backfill --from --to [--scope …]``: rate the range, resuming a former run of the same range."""
    from datetime import UTC

    from ratebeam.connectors.registry import make_fetcher
    from ratebeam.connectors.sql.job_transforms import JobSettings
    from ratebeam.connectors.sql.jobs import BACKFILL

    config = load(args)
    start, end = parse_instant(args.begin, "--from"), parse_instant(args.end, "--to")
    check_window(start, end, config.period, end_included=False)
    chunk = _chunk(args)
    now = parse_instant(args.now, "--now") if args.now else datetime.now(UTC)
    states, jobs = stores(config)
    scopes = list(dict.fromkeys(args.scope or []))
    if not scopes or not args.unlisted:  # ``--scope … --unlisted`` needs no fetcher (it may be down)
        fetcher = make_fetcher(config.fetcher)
        try:
            listed = fetcher.scopes(now)
        finally:
            fetcher.close()
        scopes = scopes or listed
        if not args.unlisted:
            check_backfill_scopes(scopes, listed, {s.scope for s in states.list_states()}, config.fetcher.backend)
    rows = [jobs.backfill(scope, start, end, config.period, now) for scope in scopes]
    resumed = sum(1 for r in rows if r.current is not None)
    print(f"backfill: {len(rows)} scope(s), {start.isoformat()} .. {end.isoformat()} (end excluded)"
          + (f"; {resumed} resumed where a former run stopped" if resumed else ""), file=sys.stderr)
    job = JobSettings(BACKFILL, chunk, tuple(r.id for r in rows))
    report = launch_jobs(config, job, "backfill", args.runner_config, now=now)
    return EXIT_OK if report.ok else EXIT_FAILED


def check_backfill_scopes(scopes: list[str], listed: list[str], rated: set[str], fetcher: str) -> None:
    """Refuse (exit 2) a ``--scope`` the fetcher does not list and that was never rated: most likely a typo.

    A backfill of such a scope would collect nothing, commit every period as empty and exit 0.
    ``--unlisted`` skips the check (a scope gone from the fetcher whose usage files remain).
    """
    unknown = [s for s in scopes if s not in listed and s not in rated]
    if unknown:
        raise CommandError(f"backfill: scope(s) {', '.join(unknown)}: not listed by the {fetcher} fetcher and never "
                           "rated (a typo?); --unlisted backfills them anyway", EXIT_BAD_INPUT)


def launch_jobs(config: RatebeamConfig, job: JobSettings, label: str, runner_config_path: str | None,
                now: datetime | None = None) -> JobsReport:
    """Load the rules, run the job on the configured runner, print what it did."""
    from datetime import UTC

    from ratebeam.pipelines.commands.common import engine_of
    from ratebeam.pipelines.commands.run import check_collector
    from ratebeam.pipelines.jobs import run_jobs
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.pipelines.runners.config import batch_runner_config
    from ratebeam.pipelines.runners.launch import launched

    check_collector(config)
    engine = engine_of(config)
    rater = load_rater(engine, config.metrics)
    engine.dispose()
    with launched(batch_runner_config(runner_config_path)) as launch:
        report = run_jobs(config, rater, job, label, now=now or datetime.now(UTC), runner=launch.runner,
                          extra_options=launch.options)
    print_jobs_report(label, report)
    return report


def print_jobs_report(label: str, report: JobsReport) -> None:
    """One summary line, then what is left and the failed frames."""
    if not report.total:
        print(f"{label}: nothing to do", file=sys.stderr)
        return
    print(f"{label}: {report.done}/{report.total} period(s) done in {report.rounds} round(s), "
          f"{report.points} point(s) written", file=sys.stderr)
    for job in report.left:
        where = "nothing done yet" if job.current is None else f"done up to {job.current.isoformat()}"
        print(f"  {job.kind} {job.id} of scope {job.scope} left ({where}); the next run continues it",
              file=sys.stderr)
    if report.busy_scopes:
        print(f"  {report.busy_scopes} scope(s) skipped: another run holds their lease", file=sys.stderr)
    for failure in report.failures[:20]:
        print(f"  scope {failure.scope_id} period {failure.begin.isoformat()} [{failure.stage}] {failure.reason}",
              file=sys.stderr)
