"""``ratebeam rpc``: serve CloudKitty's RPC (its API's state resets and quotes) until SIGTERM / SIGINT.

The server itself is ``pipelines.cloudkitty_rpc``; this module only parses the options and runs it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.common import CommandError, engine_of, load
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig

TRANSPORT_ENV = "RATEBEAM_TRANSPORT_URL"


def add_rpc_options(parser: argparse.ArgumentParser) -> None:
    """``--transport-url`` and ``--rpc-host``, shared by ``rpc`` and ``serve --rpc``."""
    parser.add_argument("--transport-url", default=os.environ.get(TRANSPORT_ENV),
                        help=f"CloudKitty's [DEFAULT]/transport_url, e.g. rabbit://user:pass@host:5672/ "
                             f"(default: ${TRANSPORT_ENV})")
    parser.add_argument("--rpc-host", help="this server's name on the topic (CloudKitty's [DEFAULT]/host; "
                                           "default: the host name)")


def add_arguments(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``ratebeam rpc`` (``command`` is the CLI's sub-command factory)."""
    from ratebeam.pipelines.commands.serve import add_health_arguments

    parser = command(sub, "rpc", cmd_rpc, "serve CloudKitty's RPC (state reset, quote) on RabbitMQ until SIGTERM; "
                                          "needs ratebeam[cloudkitty-rpc]")
    add_rpc_options(parser)
    add_health_arguments(parser)


def transport_url(args: argparse.Namespace) -> str:
    """The transport URL given (or read from ``$RATEBEAM_TRANSPORT_URL_FILE``), or the clear error asking for one."""
    if not args.transport_url and os.environ.get(TRANSPORT_ENV + "_FILE"):
        from ratebeam.pipelines.ops.environment import read_secret_file

        return read_secret_file(os.environ[TRANSPORT_ENV + "_FILE"], TRANSPORT_ENV + "_FILE")
    if not args.transport_url:
        raise CommandError(f"no transport URL: give --transport-url or set ${TRANSPORT_ENV} "
                           f"(or ${TRANSPORT_ENV}_FILE)", EXIT_BAD_INPUT)
    return str(args.transport_url)


def start_rpc(args: argparse.Namespace, config: RatebeamConfig, stop: threading.Event) -> threading.Thread:
    """Serve the RPC in a daemon thread until ``stop`` is set (``serve --rpc``)."""
    from ratebeam.pipelines.cloudkitty_rpc import serve_rpc

    url = transport_url(args)
    thread = threading.Thread(target=serve_rpc, args=(config, url, args.rpc_host, stop), name="cloudkitty-rpc",
                              daemon=True)
    thread.start()
    return thread


def cmd_rpc(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; 0 after a clean stop."""
    from ratebeam.pipelines.cloudkitty_rpc import RpcUnavailable, serve_rpc
    from ratebeam.pipelines.commands.serve import check_health_arguments
    from ratebeam.pipelines.ops.health import JobState, ServiceMonitor, database_check

    config = load(args)
    engine_of(config).dispose()  # the schema is checked once, before joining the topic
    url = transport_url(args)
    check_health_arguments(args)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    monitor = ServiceMonitor("rpc", args.metrics_port, args.metrics_host)
    server = JobState("the RPC server (on the topic)")
    monitor.add_check("database", database_check(config.database_url))
    monitor.add_check("rpc", server.check)
    if monitor.registry is not None:
        from ratebeam.pipelines.ops.figures import DatabaseFigures

        monitor.register(DatabaseFigures(config))
    try:
        serve_rpc(config, url, args.rpc_host, stop, monitor, server)
    except RpcUnavailable as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    finally:
        monitor.close()
    print("ratebeam rpc: stopped", file=sys.stderr)
    return EXIT_OK
