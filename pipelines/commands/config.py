"""``ratebeam config check``: the effective configuration, secrets masked, each value's origin (``pipelines.ops.check``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from ratebeam.pipelines.commands.common import CommandError
from ratebeam.pipelines.commands.output import add_format_argument, write_rows
from ratebeam.pipelines.exit_codes import EXIT_FAILED, EXIT_OK


def add_arguments(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``ratebeam config check`` (``command`` is the CLI's sub-command factory)."""
    group = sub.add_parser("config", help="the configuration").add_subparsers(dest="config_command", required=True)
    parser = command(group, "check", cmd_config_check,
                     "load ratebeam.yaml with the environment and secret files, metrics.yml, the event definitions "
                     "and a runner config; print every key with its value (secrets masked) and origin")
    parser.add_argument("--runner-config", help="also load this runner_configs/*.yaml file")
    parser.add_argument("--connect", action="store_true",
                        help="also open the database, the collector, the storage backends and the broker")
    add_format_argument(parser, help="table: one `key = value  # origin` line per key, then the files loaded; "
                        "json: one object (keys, loaded, connected); csv: key,value,origin")


def cmd_config_check(args: argparse.Namespace) -> int:
    """0 when everything loads (and, with ``--connect``, answers); 2 with one line on a bad value."""
    from ratebeam.connectors.errors import ConnectorError
    from ratebeam.pipelines.config import load_layered
    from ratebeam.pipelines.ops import check

    config, layered = load_layered(args.config)
    runner = None
    if args.runner_config:
        from ratebeam.pipelines.runners.config import load_runner_config

        runner = load_runner_config(args.runner_config)
    connected: list[str] = []
    if args.connect:
        try:
            connected = check.connect(config)
        except ConnectorError as exc:
            raise CommandError(f"config check --connect: {exc}", EXIT_FAILED) from None
    if args.format == "json":
        print(json.dumps({**check.as_json(config, layered, runner), "connected": connected}, indent=2))
    elif args.format == "csv":
        rows = [{"key": k, "value": json.dumps(v), "origin": o} for k, v, o in check.effective(config, layered)]
        write_rows(rows, ["key", "value", "origin"], "csv")
    else:
        check.print_text(config, layered, runner, sys.stdout)
        for line in connected:
            print(line)
    return EXIT_OK
