"""``serve``: rate as a long-running streaming job (``pipelines.serve``) until its ticks end or SIGTERM."""

from __future__ import annotations

import argparse
import sys

from ratebeam.pipelines.commands.common import CommandError, engine_of, load, parse_instant
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ratebeam serve``."""
    parser.add_argument("--runner-config", help="a runner_configs/*.yaml file with a streaming runner (Prism, Flink)")
    parser.add_argument("--runner", help="a streaming runner (PortableRunner, FlinkRunner) instead of --runner-config")
    parser.add_argument("--option", action="append", default=[], metavar="--FLAG=VALUE", dest="options",
                        help="a Beam pipeline option, e.g. --option=--job_endpoint=localhost:8073 (repeatable)")
    parser.add_argument("--interval", type=float, help="seconds between ticks (default: the config's period)")
    parser.add_argument("--now", help="simulated time: tick k rates up to NOW + k x --step (ISO-8601, UTC if naive)")
    parser.add_argument("--step", type=int, help="simulated seconds per tick with --now (default: the period)")
    parser.add_argument("--ticks", type=int, help="stop after this many ticks (default: run until SIGTERM)")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="start a failed job again this many times before giving up (default 3)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (/metrics)")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of the metrics endpoint (default all)")


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the streaming job; 0 after its ticks or a clean SIGTERM stop."""
    from ratebeam.pipelines.commands.run import check_storage
    from ratebeam.pipelines.serve import ServeError, ServeOptions, serve

    config = load(args)
    engine_of(config).dispose()  # the schema is checked once, here, before any job starts
    check_storage(config)
    runner, extra = _runner(args)
    for name in ("interval", "step", "ticks"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise InputError("command line", f"--{name}", "must be positive", str(value))
    options = ServeOptions(
        runner=runner, extra_options=tuple(extra), interval=args.interval or float(config.period),
        simulated_from=parse_instant(args.now, "--now") if args.now else None,
        step=args.step or config.period, ticks=args.ticks, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host, max_restarts=args.max_restarts,
    )
    try:
        jobs = serve(config, options)
    except ServeError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    print(f"ratebeam serve: stopped after {jobs} job(s)", file=sys.stderr)
    return EXIT_OK


def _runner(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.runner_config:
        from ratebeam.pipelines.runner_config import load_runner_config

        runner, extra = load_runner_config(args.runner_config)
        return runner, [*extra, *args.options]
    return args.runner or "FnApiRunner", list(args.options)
