"""``run``, ``demo`` and ``rate``: the commands that rate usage."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import engine_of, load, parse_instant
from ratebeam.pipelines.commands.output import FORMATS, RATED_JSONL, add_format_argument
from ratebeam.pipelines.commands.reprocess import run_pending_reprocessing
from ratebeam.pipelines.commands.run_progress import periods_progress
from ratebeam.pipelines.exit_codes import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.connectors.sql.state_store import LeaseHolder
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.cycle import CycleReport
    from ratebeam.pipelines.runners.config import RunnerConfig

LOG = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``run``'s own options."""
    parser.add_argument("--now", help="pretend the current time is this ISO-8601 instant (UTC if naive)")
    parser.add_argument("--runner-config", help="a runner_configs/*.yaml file (default: DirectRunner in memory)")
    parser.add_argument("--no-reprocess", action="store_true", help="skip the pending reprocessing schedules")
    parser.add_argument("--wait-for-leases", action="store_true",
                        help="when other runs hold due scopes' leases, wait until they are released or expire (or "
                             "their processes are gone) and rate those scopes then, instead of skipping them (one "
                             "summary per cycle)")
    parser.add_argument("--metrics-file", metavar="PATH",
                        help="write the run's figures for node_exporter's textfile collector (a *.prom file, "
                             "replaced atomically; needs ratebeam[service])")
    parser.add_argument("--pushgateway", metavar="URL",
                        help="push the run's figures to this Prometheus Pushgateway (job ratebeam_run)")
    parser.add_argument("--quiet", action="store_true", help="print no summary (the exit status says it all)")
    add_format_argument(parser, help="the summary: text for people; json: one object (periods rated, points, "
                        "failures, skipped leases, periods left by the cap) for schedulers; csv: its counters")


def cmd_run(args: argparse.Namespace) -> int:
    """One cycle over every due scope × period; 1 when a frame failed.

    The summary goes to stdout (``-f``: text, json or csv; nothing with ``--quiet``); the log stays on stderr.
    """
    config = load(args)
    started = time.monotonic()
    if args.metrics_file or args.pushgateway:  # before the run: a missing package is said at once
        from ratebeam.connectors.extras import require_extra

        require_extra("service", "--metrics-file" if args.metrics_file else "--pushgateway")
    # ``--now ""`` is a mistake (an unset shell variable), not a request for the real clock
    now = parse_instant(args.now, "--now") if args.now is not None else datetime.now(UTC)
    runner_config = None
    if args.runner_config:
        from ratebeam.pipelines.runners.config import load_runner_config

        runner_config = load_runner_config(args.runner_config)
    report = run_configured_cycle(config, now, runner_config, print_summary=False)
    failed = False
    while args.wait_for_leases and report.held_elsewhere:
        failed = failed or not (report.ok or report.blocked)
        _summary(args, report, EXIT_OK if report.ok else EXIT_FAILED)
        wait_for_leases(config, report.held_elsewhere)
        report = run_configured_cycle(config, now, runner_config, print_summary=False)
    if report.blocked:
        until = max(h.expires_at for h in report.held_elsewhere).isoformat() if report.held_elsewhere else "they expire"
        print(f"nothing was rated: other runs hold the lease of every due scope until {until} unless they renew it "
              "(they still run, or run on another host; `ratebeam run --wait-for-leases` waits for them, "
              "`ratebeam state unlock SCOPE` clears a lease whose run is known to be dead)", file=sys.stderr)
    reprocessed = args.no_reprocess or run_pending_reprocessing(config, args.runner_config)
    status = EXIT_OK if report.ok and reprocessed and not failed else EXIT_FAILED
    _summary(args, report, status)
    if args.metrics_file or args.pushgateway:
        from ratebeam.pipelines.ops.run_metrics import export, run_registry

        export(run_registry(config, report, status, started), args.metrics_file, args.pushgateway)
    return status


def _summary(args: argparse.Namespace, report: CycleReport, status: int) -> None:
    """The cycle's summary on stdout: text, one JSON object (a cycle's), or nothing."""
    from ratebeam.pipelines.commands import run_summary

    if args.quiet:
        return
    if args.format == "json":
        run_summary.print_json(report, status, sys.stdout)
    elif args.format == "csv":
        run_summary.print_csv(report, status, sys.stdout)
    else:
        run_summary.print_text(report, sys.stdout)


#: Seconds between two looks at the leases ``--wait-for-leases`` waits for.
LEASE_POLL_SECONDS = 1.0


def wait_for_leases(config: RatebeamConfig, held: list[LeaseHolder]) -> None:
    """Return once one of the ``held`` leases is free: released, expired, or its process gone.

    A live holder renews its leases while it works: this waits as long as it does, saying until
    when each time the expiry moves.
    """
    from ratebeam.connectors.sql.lease_owner import owner_gone
    from ratebeam.connectors.sql.state_store import StateStore

    scopes = {h.scope for h in held}
    engine = engine_of(config)
    store = StateStore(engine, config.scope_key, config.fetcher.backend, config.collector.backend)
    said = None
    try:
        while True:
            now = datetime.now(UTC)
            current = {h.scope: h for h in store.leases() if h.scope in scopes}
            if len(current) < len(scopes) or any(h.expires_at <= now or owner_gone(h.owner) for h in current.values()):
                return
            first = min(current.values(), key=lambda h: h.expires_at)
            if first.expires_at != said:
                said = first.expires_at
                print(f"ratebeam run: waiting for {len(current)} scope lease(s) of other runs; the first, scope "
                      f"{first.scope}'s (run {first.owner}), expires at {said.isoformat()} unless renewed",
                      file=sys.stderr)
            time.sleep(LEASE_POLL_SECONDS)
    finally:
        engine.dispose()


def run_configured_cycle(
    config: RatebeamConfig, now: datetime, runner_config: RunnerConfig | None = None,
    print_summary: bool = True,
) -> CycleReport:
    """Load the rules, run one cycle on ``runner_config`` (default: FnApiRunner in memory).

    The text summary goes to stderr unless ``print_summary`` is False (``run`` prints its own on
    stdout; ``demo`` keeps stdout for its cost summary); the warnings always go to stderr, with the log.
    """
    from ratebeam.pipelines.commands.run_summary import print_text
    from ratebeam.pipelines.cycle import run_cycle
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.pipelines.runners.config import RunnerConfig
    from ratebeam.pipelines.runners.launch import launched

    not_read = check_collector(config)
    check_storage(config)
    engine = engine_of(config)
    rater = load_rater(engine, config.metrics)
    engine.dispose()
    warn_if_no_rating_module(rater.modules)
    with launched(runner_config or RunnerConfig(runner="FnApiRunner")) as launch:
        print(f"ratebeam run: rating due periods up to {now.isoformat()} ({launch.runner})", file=sys.stderr)
        with periods_progress() as shown:
            report = run_cycle(config, rater, now=now, runner=launch.runner, extra_options=launch.options,
                               resource_hints=launch.resource_hints)
            shown.set(report.counters.get("periods_committed", 0), report.counters.get("periods_planned", 0))
    report.warnings, report.not_read = metrics_warnings(config), not_read
    if print_summary:
        print_text(report, sys.stderr)
    warn_if_nothing_collected(report)
    note_capped(report, config.max_periods_per_run)
    return report


def metrics_warnings(config: RatebeamConfig) -> list[str]:
    """What metrics.yml takes, as CloudKitty does, but bills nothing: a metric whose ``factor`` is 0.

    Every quantity of it is its offset whatever was collected; a mistake more often than a wish,
    so the run's summary says it each time.
    """
    assert config.metrics is not None  # a run loads metrics.yml
    return [f"{config.metrics_path}: {m.name} ({m.rating_type}): factor is 0: every {m.rating_type} quantity is "
            f"its offset ({m.offset}), whatever was collected" for m in config.metrics.metrics if m.factor == 0]


def note_capped(report: CycleReport, cap: int) -> None:
    """Say how many due periods the catch-up cap left for later (a long outage is caught up in steps)."""
    left = report.counters.get("periods_left_by_cap", 0)
    if left:
        print(f"ratebeam run: max_periods_per_run ({cap} per scope) capped this run: {left} more period(s) "
              "are due; the next run continues from there", file=sys.stderr)


def check_collector(config: RatebeamConfig) -> list[tuple[str, str]]:
    """Refuse at start a collector that cannot work (e.g. a missing file): exit 2, before any lease.

    Returns what its source holds that it does not read (``Collector.not_read``), each logged with why.
    """
    from ratebeam.connectors.registry import make_collector

    collector = make_collector(config.collector, config.scope_key)
    try:
        collector.check()
        not_read = collector.not_read()
    finally:
        collector.close()
    for source, why in not_read:
        LOG.warning("%s collector: %s: %s", collector.name, source, why)
    return not_read


def check_storage(config: RatebeamConfig) -> None:
    """Refuse at start a storage backend that cannot be opened (a missing package, a root that is a file)."""
    from ratebeam.connectors.registry import make_backend

    for storage in config.storage:
        backend = make_backend(storage)
        try:
            backend.check()
        finally:
            backend.close()


def warn_if_no_rating_module(modules: tuple[tuple[str, bool, int], ...]) -> None:
    """Say so when only ``noop`` is enabled: every point would be rated 0 and the run exit 0."""
    from ratebeam.connectors.sql.rules_repository import ALWAYS_ENABLED

    if not any(enabled for name, enabled, _ in modules if name != ALWAYS_ENABLED):
        print("ratebeam run: warning: no rating module is enabled (only noop): every point is rated 0; "
              "enable one with `ratebeam modules enable hashmap` (or `rules import`)", file=sys.stderr)


def warn_if_nothing_collected(report: CycleReport) -> None:
    """Say so when periods were due but the whole run collected no point (a wrong source or --now)."""
    c = report.counters
    if c.get("periods_planned", 0) and not c.get("points_collected", 0):
        print(f"ratebeam run: warning: {c['periods_planned']} period(s) were due but the run collected 0 "
              "points: check the collector's source and metrics.yml", file=sys.stderr)


def cmd_demo(args: argparse.Namespace) -> int:
    """Rate the shipped sample data into a Delta table and print a cost summary."""
    from ratebeam.pipelines.demo import run_demo
    from ratebeam.pipelines.runners.config import load_runner_config

    now = parse_instant(args.now, "--now") if args.now is not None else None
    return run_demo(Path(args.dir), load_runner_config(args.runner_config) if args.runner_config else None, now)


def add_rate_arguments(parser: argparse.ArgumentParser) -> None:
    """``rate``'s options: the usage, and the rules (a file, or the database of ``-c``)."""
    parser.add_argument("--usage", required=True, help="the usage file")
    parser.add_argument("--usage-format", default="auto",
                        choices=("auto", "jsonl", "csv", "parquet", "dataframes"),
                        help="the usage file's format (default: auto: by suffix, then content; dataframes: the "
                             "output of `report dataframes --format json`)")
    parser.add_argument("--rules", help="a rules JSON file: rate with its hashmap rules only")
    parser.add_argument("-c", "--config", help="a ratebeam.yaml: rate with its database's module chain "
                        "(hashmap rules, module states, scripts) instead of --rules")
    parser.add_argument("--explain", nargs="?", const="table", choices=FORMATS,
                        help="print each point's hashmap groups, rule ids and arithmetic instead (default table)")
    add_format_argument(parser, (RATED_JSONL, *FORMATS), default=RATED_JSONL,
                        help="rated points: jsonl (the rated file format, then its summary line), an aligned table, "
                             "one json document, or csv")


def cmd_rate(args: argparse.Namespace) -> int:
    """Price a usage file with a rules file or the database's rules (``pipelines.rate_command``)."""
    from ratebeam.pipelines.rate_command import run_rate

    return run_rate(args.rules, args.usage, config_path=args.config, usage_format=args.usage_format,
                    explain=args.explain, output_format=args.format)
