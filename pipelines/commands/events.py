"""``ratebeam events serve``: rate OpenStack notifications as one streaming job (``pipelines.events.graph``) until SIGTERM.

``ratebeam events reprocess``: the frames of a range stored again from the inbox replayed in event-time
order, late notifications included (``pipelines.events.replay``).

``ratebeam events discrepancies``: what the stream's lifecycles found to disagree with Nova's audit
(``compute.instance.exists``) or missing (a start never seen), as the job stored it
(``connectors.notifications.discrepancies``): reported, not only logged by a worker.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands import message_failures
from ratebeam.pipelines.commands.common import (
    END_WITHOUT_FINALIZING,
    CommandError,
    engine_of,
    load,
    parse_instant,
)
from ratebeam.pipelines.commands.grammar import add_time_range, spelled
from ratebeam.pipelines.commands.output import add_format_argument, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.events.graph import EventJob


_COLUMNS = ["first_seen", "last_seen", "scope", "trigger", "instance", "resource", "kind", "message_id", "run_id",
            "detail"]


def add_arguments(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``ratebeam events serve|reprocess|discrepancies|failures`` (``command`` is the CLI's sub-command factory)."""
    from ratebeam.pipelines.commands.serve import (
        add_health_arguments,
        add_restart_arguments,
        add_runner_arguments,
    )

    group = sub.add_parser("events", help="event-driven usage: OpenStack notifications (docs/events.md)")
    events = group.add_subparsers(dest="events_command", required=True)
    parser = command(events, "serve", cmd_events_serve,
                     "rate OpenStack notifications from RabbitMQ as one streaming job, until SIGTERM "
                     "(the `events:` section of ratebeam.yaml; needs ratebeam[events])")
    add_runner_arguments(parser)
    add_restart_arguments(parser)
    add_health_arguments(parser)
    parser.add_argument("--shard", metavar="K/N",
                        help="rate only the scopes of shard K of N (one job per shard, all on one inbox and "
                             "queue; default: events.shard, else every scope)")
    parser = command(events, "reprocess", cmd_events_reprocess,
                     "store the frames of a range again from the inbox replayed in event-time order, the "
                     "notifications the stream recorded late included (docs/events.md, Reprocessing)")
    add_time_range(parser, required=True, from_help="first period (ISO-8601, on a period boundary)",
                   to_help="end of the range, excluded (ISO-8601, on a period boundary)")
    parser.add_argument("--scope", action="append", default=[], help="only this scope (repeatable; default: all)")
    parser.add_argument("--runner-config", help="a runner_configs/*.yaml file (default: FnApiRunner in memory)")
    parser = command(events, "discrepancies", cmd_events_discrepancies,
                     "what the stream's lifecycles disagree on with Nova's audit (compute.instance.exists), "
                     "oldest first")
    parser.add_argument("--scope", help="only this scope")
    parser.add_argument("--kind", help="only this kind (start_not_seen, price_traits_differ...; docs/events.md)")
    add_time_range(parser, from_help="only those last found at or after this ISO-8601 instant", to_help=None)
    add_format_argument(parser)
    message_failures.add_arguments(events, command)


def event_job(config: RatebeamConfig, shard: str | None = None, timer_step: int = 0) -> EventJob:
    """The workers' settings from the validated configuration (its ``events:`` section is required here).

    ``shard``: ``--shard``'s ``K/N``, over ``events.shard``.
    """
    from ratebeam.pipelines.events.config import parse_shard
    from ratebeam.pipelines.events.graph import EventJob

    events = config.events
    if events is None or events.source is None:
        raise CommandError(f"{config.source_path}: events.source: missing: where the notifications come from "
                           "(transport_url, exchanges...; docs/events.md)", EXIT_BAD_INPUT)
    assert events.definition_set is not None and events.trigger_set is not None  # loaded with the section
    try:
        shards = parse_shard(shard or events.shard or "0/1")
    except ValueError as exc:
        raise InputError("command line", "--shard", str(exc), shard) from None
    pipelines = events.lifecycles(config.scope_key)
    read = events.trigger_set.trait_names().union(*(p.trait_names for p in pipelines.values()))
    return EventJob(database_url=config.database_url, source=events.source,
                    definitions=events.definition_set.reading_only(read),
                    triggers=events.trigger_set, pipelines=pipelines, period=config.period,
                    rebatch_rows=config.rebatch_rows, storage=config.storage, scope_key=config.scope_key,
                    shard=shards, timer_step=timer_step)


def cmd_events_serve(args: argparse.Namespace) -> int:
    """Run the event stream; 0 after a clean SIGTERM stop."""
    from ratebeam.connectors.extras import require_extra

    require_extra("events", "events serve")  # before the modules that import kombu
    from ratebeam.pipelines.commands.run import check_storage
    from ratebeam.pipelines.commands.serve import (
        check_health_arguments,
        check_restart_arguments,
        runner_config,
    )
    from ratebeam.pipelines.events.scope import STREAM_TIMER_STEP
    from ratebeam.pipelines.events.serve import EventsServeOptions, serve_events
    from ratebeam.pipelines.ops.stream import StreamMonitor
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.pipelines.runners.launch import launched
    from ratebeam.pipelines.serve import ServeError
    from ratebeam.transforms.metric_defs import MetricsConfig

    config = load(args, metrics=None)  # an events-only configuration has no polling metrics file
    job = event_job(config, args.shard, STREAM_TIMER_STEP)
    check_restart_arguments(args)
    check_health_arguments(args)
    engine = engine_of(config)  # the schema is checked once, here, before any job starts
    try:
        rater = load_rater(engine, config.metrics or MetricsConfig(()))  # none: no skip expression
    finally:
        engine.dispose()
    check_storage(config)
    with launched(runner_config(args)) as launch:
        options = EventsServeOptions(runner=launch.runner, extra_options=tuple(launch.options),
                                     max_restarts=args.max_restarts, resource_hints=launch.resource_hints,
                                     stall_timeout=args.stall_timeout)
        monitor = StreamMonitor(config, job.source.broker_url, args.metrics_port, args.metrics_host)
        try:
            jobs = serve_events(job, rater, options, monitor)
        except ServeError as exc:
            raise CommandError(str(exc), EXIT_BAD_INPUT) from None
        finally:
            monitor.close()
    print(f"ratebeam events serve: stopped after {jobs} job(s)", file=sys.stderr)
    END_WITHOUT_FINALIZING.set()
    return EXIT_OK


def cmd_events_reprocess(args: argparse.Namespace) -> int:
    """Replay the inbox and store the range's frames again; 0 when every frame is stored, 1 when one failed."""
    from ratebeam.connectors.notifications.inbox import Inbox
    from ratebeam.pipelines.commands.reprocess import check_window
    from ratebeam.pipelines.commands.run import check_storage
    from ratebeam.pipelines.events.replay import Replay, run_replay
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.pipelines.runners.config import batch_runner_config
    from ratebeam.pipelines.runners.launch import launched
    from ratebeam.transforms.metric_defs import MetricsConfig

    config = load(args, metrics=None)  # an events-only configuration has no polling metrics file
    job = event_job(config)
    begin, end = parse_instant(args.begin, "--from"), parse_instant(args.end, "--to")
    check_window(begin, end, config.period, end_included=False)
    replay = Replay(begin, end, tuple(args.scope))
    until = end + job.frame_delay  # the latest notification time the replay reads
    engine = engine_of(config)  # refuses a schema that is not up to date
    try:
        rater = load_rater(engine, config.metrics or MetricsConfig(()))  # none: no skip expression
    finally:
        engine.dispose()
    check_storage(config)
    inbox = Inbox(config.database_url)
    try:
        total, late = inbox.history_counts(until)
    finally:
        inbox.engine.dispose()
    with launched(batch_runner_config(args.runner_config)) as launch:
        print(f"ratebeam events reprocess: replaying {total} notification(s) up to {until.isoformat()} ({late} recorded late "
              f"by the stream) on {launch.runner}", file=sys.stderr)
        report = run_replay(job, rater, replay, launch.runner, launch.options)
    done = report.tallies
    print(f"ratebeam events reprocess: {begin.isoformat()} to {end.isoformat()}: {done.get('frames_stored', 0)} "
          f"frame(s) of {done.get('scopes_stored', 0)} scope(s) stored again ({done.get('points_written', 0)} "
          f"point(s), {done.get('stale_types_deleted', 0)} stale type(s) deleted), {len(report.failed)} failed",
          file=sys.stderr)
    if replay.scopes and done.get("scopes_stored", 0) < len(replay.scopes):
        print(f"ratebeam events reprocess: warning: {len(replay.scopes) - done.get('scopes_stored', 0)} of the "
              f"--scope values have no notification in the inbox up to {until.isoformat()}: "
              "nothing was stored for them", file=sys.stderr)
    for outcome in report.failed:
        print(f"  {outcome.scope_id} {outcome.begin.isoformat()}: {outcome.stage}: {outcome.reason}", file=sys.stderr)
    return EXIT_FAILED if report.failed else EXIT_OK


def cmd_events_discrepancies(args: argparse.Namespace) -> int:
    """List the stored discrepancies matching ``--scope``/``--kind``/``--from``; 0 whether or not there are any."""
    from ratebeam.connectors.notifications.discrepancies import DiscrepancyStore
    from ratebeam.transforms.events.reconcile import DISCREPANCY_KINDS

    if args.kind is not None and args.kind not in DISCREPANCY_KINDS:
        raise InputError("command line", "--kind", f"not a discrepancy kind (one of {', '.join(DISCREPANCY_KINDS)})",
                         args.kind)
    since = parse_instant(args.begin, spelled(args, "begin")) if args.begin else None
    config = load(args, metrics=False)
    engine_of(config).dispose()  # refuses a schema that is not up to date, with the command that fixes it
    store = DiscrepancyStore(config.database_url)
    try:
        found = store.listing(scope=args.scope, kind=args.kind, since=since)
    finally:
        store.engine.dispose()
    rows = [{"first_seen": d.first_seen_at, "last_seen": d.last_seen_at, "scope": d.scope, "trigger": d.trigger,
             "instance": d.instance_key.replace("\x1f", " | "), "resource": d.resource_id, "kind": d.kind, "message_id": d.message_id,
             "detail": d.detail, "run_id": d.run_id} for d in found]
    write_rows(rows, _COLUMNS, args.format, footer=f"({len(rows)} discrepancy(ies))")
    return EXIT_OK
