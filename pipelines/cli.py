"""The ``ratebeam`` command line: run cycles, manage rules and state, report, price usage files.

Every command validates its inputs at the edge; a bad file or argument prints one line naming the
file, key and value and exits with status 2 — never a traceback.  Heavy modules are imported per
command so ``ratebeam --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ratebeam.pipelines.errors import InputError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FRAME_FAILED = 3


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", default=os.environ.get("RATEBEAM_CONFIG", "ratebeam.yaml"),
        help="ratebeam.yaml (default: $RATEBEAM_CONFIG or ./ratebeam.yaml)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="ratebeam", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="rate every due scope × period once (one cycle)")
    _add_config(run)
    run.add_argument("--now", help="pretend the current time is this ISO-8601 instant (UTC if naive)")
    run.add_argument("--runner-config", help="a runner_configs/*.yaml file (default: DirectRunner in memory)")

    demo = sub.add_parser("demo", help="rate the shipped sample data into Parquet and print a cost summary")
    demo.add_argument("--dir", default="ratebeam-demo", help="working directory for the demo (default ./ratebeam-demo)")

    rate = sub.add_parser("rate", help="price a usage JSONL file with a rules JSON file (no server, no state)")
    rate.add_argument("--rules", required=True)
    rate.add_argument("--usage", required=True)

    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    _add_config(db_sub.add_parser("upgrade", help="create or migrate the schema"))

    rules = sub.add_parser("rules", help="hashmap rules")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    imp = rules_sub.add_parser("import", help="replace all hashmap rules with a rules JSON file")
    _add_config(imp)
    imp.add_argument("file")
    exp = rules_sub.add_parser("export", help="write the hashmap rules as rules JSON")
    _add_config(exp)
    exp.add_argument("file", nargs="?", default="-")
    _add_config(rules_sub.add_parser("list", help="list services, fields, mappings and thresholds"))

    modules = sub.add_parser("modules", help="rating modules: hashmap, noop, scripted")
    modules_sub = modules.add_subparsers(dest="modules_command", required=True)
    _add_config(modules_sub.add_parser("list", help="each module's state and priority"))
    for name in ("enable", "disable"):
        p = modules_sub.add_parser(name, help=f"{name} a module")
        _add_config(p)
        p.add_argument("module", choices=("hashmap", "noop", "scripted"))
    prio = modules_sub.add_parser("priority", help="set a module's priority (higher runs first)")
    _add_config(prio)
    prio.add_argument("module", choices=("hashmap", "noop", "scripted"))
    prio.add_argument("priority", type=int)

    scripts = sub.add_parser("scripts", help="safe rating scripts of the scripted module")
    scripts_sub = scripts.add_subparsers(dest="scripts_command", required=True)
    add = scripts_sub.add_parser("add", help="add or replace a script from a JSON file")
    _add_config(add)
    add.add_argument("file")
    add.add_argument("--start", help="valid from (ISO-8601; default: now)")
    add.add_argument("--end", help="valid until, excluded (ISO-8601; default: open)")
    _add_config(scripts_sub.add_parser("list", help="the stored scripts"))
    rm = scripts_sub.add_parser("delete", help="delete a script")
    _add_config(rm)
    rm.add_argument("name")

    state = sub.add_parser("state", help="scope state")
    state_sub = state.add_subparsers(dest="state_command", required=True)
    _add_config(state_sub.add_parser("list", help="every scope's last processed period"))
    reset = state_sub.add_parser("reset", help="delete a scope's rated data from a period on and rate it again")
    _add_config(reset)
    reset.add_argument("scope")
    reset.add_argument("--from", dest="begin", required=True, help="first period to re-rate (ISO-8601)")
    for name in ("activate", "deactivate"):
        p = state_sub.add_parser(name, help=f"{name} a scope")
        _add_config(p)
        p.add_argument("scope")

    report = sub.add_parser("report", help="read rated data back")
    report_sub = report.add_subparsers(dest="report_command", required=True)
    summary = report_sub.add_parser("summary", help="totals of qty and price, grouped")
    dataframes = report_sub.add_parser("dataframes", help="the rated points themselves")
    for p in (summary, dataframes):
        _add_config(p)
        p.add_argument("--begin", help="ISO-8601 (default: start of the current month)")
        p.add_argument("--end", help="ISO-8601 (default: start of next month)")
        p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                       help="keep points whose groupby or metadata KEY equals VALUE (repeatable)")
        p.add_argument("--type", action="append", default=[], help="metric type (repeatable)")
        p.add_argument("--format", choices=("table", "json"), default="table")
        p.add_argument("--offset", type=int, default=0)
        p.add_argument("--limit", type=int, default=1000)
    summary.add_argument("--groupby", default="", help="comma-separated: type, time, time-d|w|m|y, any groupby key")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ratebeam`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("apache_beam", "absl", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from ratebeam.pipelines import commands

    try:
        return commands.dispatch(args)
    except InputError as exc:
        print(f"ratebeam: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except commands.CommandError as exc:
        print(f"ratebeam: {exc}", file=sys.stderr)
        return exc.status


if __name__ == "__main__":
    sys.exit(main())
