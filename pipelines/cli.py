"""The ``ratebeam`` command line: run cycles, manage rules and state, report, price usage files.

Every command validates its inputs at the edge; a bad file or argument prints one line naming the
file, key and value and exits with status 2 — never a traceback (statuses: ``exit_codes``).  Each
sub-command's parser names its handler (``set_defaults(func=...)``); the handlers import Beam,
Polars and the backends themselves, so ``ratebeam --help`` or ``modules list`` start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from ratebeam.pipelines.commands import (
    chart,
    config,
    events,
    explain,
    failures,
    gaps,
    hashmap,
    report,
    reprocess,
    rpc,
    rules,
    rules_diff,
    run,
    serve,
    state,
    storage,
)
from ratebeam.pipelines.commands.common import END_WITHOUT_FINALIZING, CommandError, integer
from ratebeam.pipelines.commands.grammar import add_global_options, add_time_range, spread_global_options
from ratebeam.pipelines.commands.logs import configure_logging
from ratebeam.pipelines.commands.output import add_format_argument
from ratebeam.pipelines.commands.parser import RatebeamParser
from ratebeam.pipelines.errors import MAX_LINE, InputError, short
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERNAL

MODULES = ("hashmap", "noop", "scripted")


def _add_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """No-op kept for the command modules that take it: ``-c`` is a global option (``grammar``)."""
    return parser


def _add_create(parser: argparse.ArgumentParser) -> None:
    """``--create``: a scope command may make an unknown scope only when told (a typo is an error)."""
    parser.add_argument("--create", action="store_true", help="create the scope's state if it has none")


_SubCommands = argparse._SubParsersAction  # argparse's (private) type of ``add_subparsers()``


def _command(
    sub: _SubCommands, name: str, func: Callable[[argparse.Namespace], int], help: str, *, config: bool = True,
    **defaults: object,
) -> argparse.ArgumentParser:
    """A sub-command parser running ``func``; ``config`` False: it reads no configuration (``-c`` is ignored).

    The global options (``-c``, ``--log-level``...) are added to every command at the end of
    ``build_parser`` (``grammar.spread_global_options``).
    """
    parser = sub.add_parser(name, help=help, description=help)
    parser.set_defaults(func=func, **defaults)
    return parser


def _group(sub: _SubCommands, name: str, help: str) -> _SubCommands:
    """A command group: a sub-command whose own sub-commands are required."""
    return sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = RatebeamParser(prog="ratebeam", description=__doc__.splitlines()[0].replace("``", ""))
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    run.add_arguments(_command(sub, "run", run.cmd_run, "rate every due scope × period once (one cycle)"))
    reprocess.add_arguments(sub, _command)
    serve.add_arguments(_command(sub, "serve", serve.cmd_serve,
                                 "rate continuously as one streaming job (a tick every period), until SIGTERM"))
    p = _command(sub, "demo", run.cmd_demo, "rate the shipped sample data into a Delta table and print a cost summary",
                 config=False)
    p.add_argument("--dir", default="ratebeam-demo", help="working directory for the demo (default ./ratebeam-demo)")
    p.add_argument("--runner-config", help="a runner_configs/*.yaml file (default: DirectRunner in memory)")
    p.add_argument("--now", help="pretend the current time is this ISO-8601 instant (UTC if naive): the shipped "
                   "usage is moved to end two periods before it (default: the clock)")
    run.add_rate_arguments(_command(sub, "rate", run.cmd_rate, "price a usage file (JSONL, CSV, Parquet, "
                                    "dataframes JSON) with a rules file or the database's rules (a quote)",
                                    config=False))

    _command(_group(sub, "db", "database schema"), "upgrade", rules.cmd_db_upgrade, "create or migrate the schema")

    group = _group(sub, "rules", "hashmap rules")
    p = _command(group, "import", rules.cmd_rules_import,
                 "replace all hashmap rules with a rules JSON file (unchanged rules keep their ids)")
    p.add_argument("file", help="the rules JSON file")
    p.add_argument("--merge", action="store_true", help="add or update the file's rules, keep the others "
                   "(default: replace every rule)")
    _command(group, "export", rules.cmd_rules_export, "write the hashmap rules as rules JSON").add_argument(
        "file", nargs="?", default="-", help="where to write it (-: stdout)")
    add_format_argument(_command(group, "list", rules.cmd_rules_list, "list services, fields, mappings and thresholds"))
    rules_diff.add_arguments(group, _command)
    hashmap.add_arguments(sub, _add_config)

    group = _group(sub, "modules", "rating modules: hashmap, noop, scripted")
    add_format_argument(_command(group, "list", rules.cmd_modules_list, "each module's state and priority"))
    for name, enable in (("enable", True), ("disable", False)):
        _command(group, name, rules.cmd_modules_toggle, f"{name} a module",
                 enable=enable).add_argument("module", choices=MODULES, help="the rating module")
    p = _command(group, "priority", rules.cmd_modules_priority, "set a module's priority (higher runs first)")
    p.add_argument("module", choices=MODULES, help="the rating module")
    p.add_argument("priority", type=integer, help="its priority, an integer")

    group = _group(sub, "scripts", "safe rating scripts of the scripted module")
    p = _command(group, "add", rules.cmd_scripts_add, "add or replace a script from a JSON file")
    p.add_argument("file", help="the script's JSON file (docs/formats.md)")
    p.add_argument("--start", help="valid from (ISO-8601; default: a replaced script's start, "
                   "else 1970-01-01 as for rules)")
    p.add_argument("--end", help="valid until, excluded (ISO-8601; default: open)")
    add_format_argument(_command(group, "list", rules.cmd_scripts_list, "the stored scripts"))
    _command(group, "delete", rules.cmd_scripts_delete, "delete a script").add_argument("name", help="its name")

    group = _group(sub, "state", "scope state")
    add_format_argument(_command(group, "list", state.cmd_state_list, "every scope's last processed period"))
    p = _command(group, "reset", state.cmd_state_reset, "delete a scope's rated data from a period on and rate it again")
    p.add_argument("scope", help="the scope id")
    add_time_range(p, required=True, from_help="first period to re-rate (ISO-8601)", to_help=None)
    p.add_argument("--yes", action="store_true", help="really delete (without it: say what would be deleted)")
    _add_create(p)
    _command(group, "unlock", state.cmd_state_unlock,
             "clear a scope's lease (its run is dead); state and rated data are kept").add_argument(
        "scope", help="the scope id")
    for name, activate in (("activate", True), ("deactivate", False)):
        p = _command(group, name, state.cmd_state_toggle, f"{name} a scope", activate=activate)
        p.add_argument("scope", help="the scope id")
        _add_create(p)

    rpc.add_arguments(sub, _command)
    events.add_arguments(sub, _command)
    config.add_arguments(sub, _command)

    group = _group(sub, "storage", "storage backends")
    add_format_argument(_command(
        group, "info", storage.cmd_storage_info,
        "what each configured backend supports (delete, exact totals, how a rewrite replaces a period)"))
    storage.add_arguments(group, _command)

    failures.add_arguments(sub, _command)
    gaps.add_arguments(sub, _command)

    group = _group(sub, "report", "read rated data back")
    summary = _command(group, "summary", report.cmd_report_summary, "totals of qty and price, grouped")
    dataframes = _command(group, "dataframes", report.cmd_report_dataframes, "the rated points themselves")
    for p in (summary, dataframes):
        add_time_range(p, from_help="ISO-8601 (default: start of the current month)",
                       to_help="ISO-8601, excluded (default: start of next month)")
        p.add_argument("--scope", action="append", default=[], help="only this scope (repeatable)")
        p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                       help="keep points whose groupby or metadata KEY equals VALUE; KEY:VALUE too (repeatable)")
        p.add_argument("--type", action="append", default=[], help="metric type (repeatable)")
        add_format_argument(p)
        p.add_argument("--offset", type=integer, default=0, help="skip this many rows (pagination)")
        p.add_argument("--limit", type=integer, default=1000, help="at most this many rows (pagination)")
        report.add_backend_argument(p)
    summary.add_argument("--groupby", action="append", default=[],
                         help="comma-separated and repeatable: type, time, time-d|w|m|y, any groupby key (default: "
                         "none: one row per unit, the window's total); without type, qty is summed per unit")
    summary.add_argument("--custom-fields",
                         help="InfluxQL aggregates instead of SUM(qty), SUM(price) (InfluxDB storage only)")
    chart.add_commands(group, _command)
    explain.add_arguments(group, _command)
    spread_global_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ratebeam`` console script."""
    from ratebeam.connectors.errors import ConnectorError, FatalConnectorError

    args = build_parser().parse_args(argv)
    try:
        configure_logging(args)
        status = args.func(args)
        sys.stdout.flush()  # inside the try: a reader gone (``| head``) is found here, not at exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except InputError as exc:
        return _refused(str(exc), EXIT_BAD_INPUT)
    except CommandError as exc:
        return _refused(str(exc), exc.status)
    except FatalConnectorError as exc:  # the run stopped: one line, exit status 2
        return _refused(exc.reason, EXIT_BAD_INPUT)
    except ConnectorError as exc:
        return _refused(str(exc), EXIT_FAILED)
    except Exception as exc:  # the last resort: a bug, said as one, never passed off as bad input
        return _internal_error(exc)
    except BaseException as exc:  # a Rust panic (pyo3's PanicException) is no Exception; Ctrl-C stays one
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        return _internal_error(exc)


def _refused(message: str, status: int) -> int:
    """``ratebeam: MESSAGE`` on stderr, cut to ``MAX_LINE`` characters; returns ``status``."""
    print(f"ratebeam: {short(message, MAX_LINE)}", file=sys.stderr)
    return status


def _internal_error(exc: BaseException) -> int:
    """An error no reader expected: one line saying it is a bug (``-v`` logs the traceback), status 70."""
    logging.getLogger("ratebeam").debug("internal error", exc_info=exc)
    text = str(exc).strip()
    print(f"ratebeam: internal error (a bug: please report it; -v shows the traceback): {type(exc).__name__}"
          + (f": {short(text.splitlines()[0])}" if text else ""), file=sys.stderr)
    return EXIT_INTERNAL


def _reader_gone() -> int:
    """The reader of stdout stopped reading (``report ... | head``): no traceback, the SIGPIPE status.

    stdout is pointed at /dev/null so the interpreter's final flush cannot fail again (Python's
    documented recipe, ``signal`` module notes on SIGPIPE).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def console_main() -> None:
    """The ``ratebeam`` console script: :func:`main`, then the process's exit with its status.

    After ``events serve`` has stopped its streaming job, the in-process (LOOPBACK) SDK worker's
    gRPC threads can still be running when the interpreter finalizes, and gRPC's C core then aborts
    the process (SIGABRT, exit -6: about one stop in five on a loaded machine), although the job,
    the runner and every connection of ratebeam are closed by then.  Such a run ends with
    ``os._exit`` once the logs and the standard streams are flushed.
    """
    status = main()
    if END_WITHOUT_FINALIZING.is_set():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    console_main()
