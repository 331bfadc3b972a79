"""``serve``: rate as a long-running streaming job (``pipelines.serve``) until its ticks end or SIGTERM."""

from __future__ import annotations

import argparse
import math
import sys
import threading
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import (
    CommandError,
    bounded,
    engine_of,
    integer,
    load,
    number,
    parse_instant,
)
from ratebeam.pipelines.commands.rpc import add_rpc_options, start_rpc
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.pipelines.runners.config import RunnerConfig


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """``--runner-config``, ``--runner`` and ``--option``: the streaming runner (``serve``, ``events serve``)."""
    parser.add_argument("--runner-config", help="a runner_configs/*.yaml file with a streaming runner (Prism, Flink)")
    parser.add_argument("--runner", help="a streaming runner (PortableRunner, FlinkRunner) instead of --runner-config")
    parser.add_argument("--option", action="append", default=[], metavar="--FLAG=VALUE", dest="options",
                        help="a Beam pipeline option, e.g. --option=--job_endpoint=localhost:8073 (repeatable)")


def add_restart_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-restarts`` and ``--stall-timeout``: when a streaming job is started again (``serve``, ``events serve``)."""
    from ratebeam.pipelines.ops.watchdog import STALL_TIMEOUT_S

    parser.add_argument("--max-restarts", type=integer, default=3,
                        help="start a failed or stuck job again this many times before giving up (default 3)")
    parser.add_argument("--stall-timeout", type=number, default=STALL_TIMEOUT_S, metavar="SECONDS",
                        help="cancel the job, and start it again, when its clock has not moved for this long "
                             f"(a runner that lost its SDK worker; default {STALL_TIMEOUT_S:.0f})")


def check_restart_arguments(args: argparse.Namespace) -> None:
    """``--max-restarts`` and ``--stall-timeout`` within their ranges (else ``InputError``)."""
    bounded(args.max_restarts, "--max-restarts", 0, 1000)
    if not (math.isfinite(args.stall_timeout) and 1 <= args.stall_timeout <= MAX_STALL_TIMEOUT):
        raise InputError("command line", "--stall-timeout", f"must be a number of seconds from 1 to {MAX_STALL_TIMEOUT}",
                         str(args.stall_timeout))


#: The longest ``--stall-timeout``: a day.
MAX_STALL_TIMEOUT = 86_400


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host``: health and metrics of a long-running command (``pipelines.ops``)."""
    parser.add_argument("--metrics-port", type=integer,
                        help="serve /metrics (Prometheus), /healthz/live and /healthz/ready on this port "
                             "(needs ratebeam[service])")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of the metrics and health endpoint")


def check_health_arguments(args: argparse.Namespace) -> None:
    """``--metrics-port`` is a port, and prometheus-client is installed when one is asked for (before anything starts)."""
    from ratebeam.connectors.extras import require_extra
    from ratebeam.pipelines.serve_metrics import METRICS_PORT

    if args.metrics_port is not None:
        bounded(args.metrics_port, METRICS_PORT, 1, 65535)
        require_extra("service", METRICS_PORT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ratebeam serve``."""
    add_runner_arguments(parser)
    parser.add_argument("--interval", type=number, help="seconds between ticks (default: the config's period)")
    parser.add_argument("--now", help="simulated time: tick k rates up to NOW + k x --step (ISO-8601, UTC if naive)")
    parser.add_argument("--step", type=integer, help="simulated seconds per tick with --now (default: the period)")
    parser.add_argument("--ticks", type=integer, help="stop after this many ticks (default: run until SIGTERM)")
    add_restart_arguments(parser)
    add_health_arguments(parser)
    parser.add_argument("--rpc", action="store_true",
                        help="also serve CloudKitty's RPC (as `ratebeam rpc`; needs ratebeam[cloudkitty-rpc])")
    add_rpc_options(parser)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the streaming job; 0 after its ticks or a clean SIGTERM stop."""
    from ratebeam.pipelines.commands.run import check_storage, metrics_warnings
    from ratebeam.pipelines.runners.launch import launched
    from ratebeam.pipelines.serve import ServeError, ServeOptions, serve

    config = load(args)
    engine_of(config).dispose()  # the schema is checked once, here, before any job starts
    check_storage(config)
    for warning in metrics_warnings(config):  # a service has no run summary: said once, at start
        print(f"warning: {warning}", file=sys.stderr)
    _check_numbers(args)
    _check_extras(args)
    chosen = runner_config(args)
    if chosen.runner == "DaskRunner":  # refused before a cluster is started for nothing
        raise CommandError("serve needs a streaming runner (Prism, Flink): Dask is a batch engine; run `ratebeam run "
                           "--runner-config dask.yaml` from a scheduler instead (docs/dask.md)", EXIT_BAD_INPUT)
    # What the runner needs (Prism, an EXTERNAL worker pool) runs as long as the service does.
    with launched(chosen) as launch:
        options = ServeOptions(
            runner=launch.runner, extra_options=tuple(launch.options), interval=args.interval or float(config.period),
            simulated_from=parse_instant(args.now, "--now") if args.now is not None else None,
            step=args.step or config.period, ticks=args.ticks, metrics_port=args.metrics_port,
            metrics_host=args.metrics_host, max_restarts=args.max_restarts, resource_hints=launch.resource_hints,
            stall_timeout=args.stall_timeout,
        )
        stop_rpc = threading.Event()
        if args.rpc:
            start_rpc(args, config, stop_rpc)
        try:
            jobs = serve(config, options)
        except ServeError as exc:
            raise CommandError(str(exc), EXIT_BAD_INPUT) from None
        finally:
            stop_rpc.set()
    print(f"ratebeam serve: stopped after {jobs} job(s)", file=sys.stderr)
    return EXIT_OK


#: Most ticks one ``serve`` may be asked for: the last tick's time must stay a Beam timestamp
#: (int64 microseconds) at the longest interval; without ``--ticks`` it runs until stopped.
MAX_TICKS = 100_000


def _check_numbers(args: argparse.Namespace) -> None:
    """The numeric options in the range the service can hold, before anything starts (else ``InputError``)."""
    from ratebeam.pipelines.config import MAX_PERIOD

    interval = args.interval
    if interval is not None and not (math.isfinite(interval) and 0 < interval <= MAX_PERIOD):
        raise InputError("command line", "--interval", f"must be a number of seconds above 0, at most {MAX_PERIOD}",
                         str(interval))
    for name, low, high in (("step", 1, MAX_PERIOD), ("ticks", 1, MAX_TICKS)):
        if getattr(args, name) is not None:
            bounded(getattr(args, name), "--" + name.replace("_", "-"), low, high)
    if args.now is not None and args.ticks is None:
        raise InputError("command line", "--now", "a simulated clock needs --ticks (how many ticks to run)", args.now)
    check_restart_arguments(args)


def _check_extras(args: argparse.Namespace) -> None:
    """The optional packages the options ask for, before a runner starts (a thread would only log their error)."""
    from ratebeam.connectors.extras import require_extra

    check_health_arguments(args)
    if args.rpc:
        require_extra("cloudkitty-rpc", "--rpc")


def runner_config(args: argparse.Namespace) -> RunnerConfig:
    """The runner config file with the ``--option`` flags added, or ``--runner`` with them."""
    from ratebeam.pipelines.runners.config import RunnerConfig, load_runner_config
    from ratebeam.pipelines.validation import validate

    if args.runner_config:
        doc = load_runner_config(args.runner_config).model_dump(exclude_none=True, mode="json")  # lists, as read
        return validate(RunnerConfig, {**doc, "options": [*doc["options"], *args.options]}, args.runner_config)
    return validate(RunnerConfig, {"runner": args.runner or "FnApiRunner", "options": list(args.options)},
                    "command line")
