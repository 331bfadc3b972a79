"""``ratebeam rate``: price a usage file (the quote), with a rules file or with the database's rating setup.

Useful to try rules before importing them, to quote usage, and to compare ratebeam with CloudKitty's
own hashmap module on the same input (interchange.md).  The usage is JSONL, CSV, Parquet or the
output of ``report dataframes --format json`` (``interchange.usage_tables``).  With ``--rules``
only the hashmap runs, on that file's rules; with ``-c ratebeam.yaml`` the database's whole module
chain runs as in a cycle — hashmap rules, module states and priorities, the scripts valid at each
period — except ``skip_datapoints_expression``, a storage filter: a quote prices every point it
is given.  Exit status: 0 all rated, 3 when a frame failed (its points carry ``"price": null`` and
the error), 2 on bad input with one line on stderr.

``--explain table|json`` prints, instead of the rated lines, each point's hashmap groups with the
ids and values of their flat, rates and threshold and the arithmetic of its price
(``transforms.explain``, as ``report explain`` does for stored points); the hashmap only: another
module of a ``-c`` chain (scripts) is not explained.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import polars as pl

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_FRAME_FAILED, EXIT_OK
from ratebeam.pipelines.interchange import read_rules, write_rated
from ratebeam.pipelines.interchange.rated import RatedSummary
from ratebeam.pipelines.interchange.usage_tables import read_usage_file
from ratebeam.transforms.hashmap import RatingOutcome, rate
from ratebeam.transforms.rules import RuleSet


def run_rate(rules_path: str | Path | None, usage_path: str | Path, out: TextIO | None = None,
             err: TextIO | None = None, *, config_path: str | Path | None = None, usage_format: str = "auto",
             explain: str | None = None, output_format: str = "jsonl") -> int:
    """Rate ``usage_path`` and write rated JSONL to ``out`` (stdout by default).

    ``explain`` (``table``, ``json`` or ``csv``): write each point's explanation instead.
    ``output_format``: ``jsonl`` (the rated file), or the rows as ``table``, ``json`` or ``csv``.

    The rules come from ``rules_path`` or, with ``config_path``, from the configured database
    (exactly one of the two).  Returns the exit status; bad input is reported on ``err`` (stderr
    by default) as ``<file>: <where>: <what>``.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        if rules_path is not None and config_path is not None:
            raise InputError("command line", "--rules", "give a rules file or -c (the database's rules), not both")
        if config_path is not None:
            rater, scope_key, rules = _database_rater(config_path, err)
        elif rules_path is not None:
            rules = read_rules(rules_path)
            rater, scope_key = (lambda usage: rate(usage, rules)), "project_id"
        else:
            raise InputError("command line", "--rules", "required: a rules file, or -c ratebeam.yaml for the "
                             "database's rules")
        usage = read_usage_file(usage_path, usage_format, scope_key)
    except InputError as error:
        print(f"ratebeam rate: {error}", file=err)
        return EXIT_BAD_INPUT
    if explain is not None:
        from ratebeam.pipelines.commands.explain import write_explanations
        from ratebeam.transforms.explain import explain as explain_points

        return write_explanations(explain_points(usage, rules), explain, out)
    if output_format == "jsonl":
        summary = write_rated(usage, rater(usage), out)
    else:
        summary = _write_rows(usage, rater(usage), output_format, out)
    return EXIT_FRAME_FAILED if summary.errors else EXIT_OK


def _write_rows(usage: pl.DataFrame, outcome: RatingOutcome, fmt: str, out: TextIO) -> RatedSummary:
    """The rated lines as ``fmt`` rows (json: ``{"points": [...], "summary": {...}}``)."""
    import io
    import json

    from ratebeam.pipelines.commands.output import write_json, write_rows

    text = io.StringIO()
    summary = write_rated(usage, outcome, text)
    *lines, last = [json.loads(line) for line in text.getvalue().splitlines()]
    if fmt == "json":
        write_json({"points": lines, "summary": last["summary"]}, out)
    else:
        columns = ["i", "type", "scope", "begin", "end", "qty", "price", "error"]
        totals = last["summary"]
        write_rows(lines, columns, fmt, out, footer=f"({totals['count']} point(s), {totals['errors']} failed "
                   f"frame(s), total {totals['total']})")
    return summary


def _database_rater(config_path: str | Path, err: TextIO) -> tuple[Callable[[pl.DataFrame], RatingOutcome], str,
                                                                   RuleSet]:
    """The cycle's module chain from the configured database, the configuration's scope key, the rules."""
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.migrations import check_schema
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.transforms.metric_defs import MetricsConfig

    config = load_config(config_path, metrics=False)
    engine = make_engine(config.database_url)
    try:
        check_schema(engine)
        factory = load_rater(engine, MetricsConfig(metrics=()), lineage=False)  # no storage filter in a quote
    finally:
        engine.dispose()
    if not any(enabled for name, enabled, _ in factory.modules if name != "noop"):
        print("ratebeam rate: warning: no rating module is enabled in the database: every price is the input "
              "price (`ratebeam modules enable hashmap`)", file=err)
    chain = factory()

    def rater(usage: pl.DataFrame) -> RatingOutcome:
        rated, failures = chain(usage)
        return RatingOutcome(rated=rated, failures=failures)

    return rater, config.scope_key, factory.rules
