"""Command-line arguments: instants, paging, priorities, resets, runner configs, output paths."""

from __future__ import annotations

import sys

import pytest

from bad_input.harness import Case, check_refused, cli, params, replace, write
from ratebeam.pipelines.demo import DEMO_NOW

C = ("-c", "{c}")
NOW = DEMO_NOW.isoformat()
RUN = ("run", *C, "--now", NOW)
OVERFLOW = "9999-12-31T23:59:59-23:59"
HUGE = str(10**25)


def _runner(text: str | bytes) -> object:
    return write("runner.yaml", text)


WITH_RUNNER = (*RUN, "--runner-config", "{ws}/runner.yaml")

NOW_CASES = [Case(f"now-{n}", None, ("run", *C, "--now", v), names=("--now", repr(v)))
             for n, v in {"empty": "", "blank": " ", "word": "yesterday", "month-13": "2026-13-01",
                          "overflow": OVERFLOW, "underflow": "0001-01-01T00:00:00+00:01", "epoch": "1767225600",
                          "two-instants": "2026-01-01/2026-02-01"}.items()]

SERVE_CASES = [
    Case("serve-now-empty", None, ("serve", *C, "--now", ""), names=("--now", "''")),
    Case("serve-now-overflow", None, ("serve", *C, "--now", OVERFLOW), names=("--now",)),
    Case("serve-ticks-zero", None, ("serve", *C, "--ticks", "0"), names=("--ticks", "0")),
    Case("serve-step-negative", None, ("serve", *C, "--now", NOW, "--step", "-60"), names=("--step", "-60")),
]

REPORT_CASES = []
for command in ("summary", "dataframes"):
    report = ("report", command, *C)
    REPORT_CASES += [
        Case(f"{command}-limit-negative", None, (*report, "--limit", "-1"), names=("--limit", "-1")),
        Case(f"{command}-limit-zero", None, (*report, "--limit", "0"), names=("--limit", "0")),
        Case(f"{command}-limit-huge", None, (*report, "--limit", HUGE), names=("--limit", HUGE)),
        Case(f"{command}-offset-negative", None, (*report, "--offset", "-5"), names=("--offset", "-5")),
        Case(f"{command}-offset-huge", None, (*report, "--offset", HUGE), names=("--offset", HUGE)),
        Case(f"{command}-offset-5000-digits", None, (*report, "--offset", "9" * 5000), usage=True,
             names=("--offset", "not an integer")),
        Case(f"{command}-limit-text", None, (*report, "--limit", "ten"), usage=True, names=("--limit",)),
        Case(f"{command}-begin-garbage", None, (*report, "--begin", "last week"), names=("--begin", "last week")),
        Case(f"{command}-begin-empty", None, (*report, "--begin", ""), names=("--begin", "''")),
        Case(f"{command}-end-empty", None, (*report, "--end", ""), names=("--end", "''")),
        Case(f"{command}-begin-overflow", None, (*report, "--begin", OVERFLOW), names=("--begin",)),
        Case(f"{command}-end-garbage", None, (*report, "--end", "later"), names=("--end", "later")),
        Case(f"{command}-begin-after-end", None, (*report, "--begin", "2026-02-01", "--end", "2026-01-01"),
             names=("--begin",)),
        Case(f"{command}-empty-window", None, (*report, "--begin", "2026-01-01", "--end", "2026-01-01"),
             names=("--begin",)),
        Case(f"{command}-filter-no-equals", None, (*report, "--filter", "project_id"), names=("--filter",)),
        Case(f"{command}-filter-no-key", None, (*report, "--filter", "=acme"), names=("--filter", "=acme")),
        Case(f"{command}-format-xml", None, (*report, "--format", "xml"), usage=True, names=("--format",)),
    ]
REPORT_CASES += [
    Case("summary-groupby-unknown", None, ("report", "summary", *C, "--groupby", "colour"),
         names=("--groupby", "colour")),
    Case("summary-groupby-metadata", None, ("report", "summary", *C, "--groupby", "flavor_name"),
         names=("--groupby", "flavor_name")),
    Case("summary-custom-fields-parquet", None, ("report", "summary", *C, "--custom-fields", "SUM(qty)"),
         names=("--custom-fields",)),
]

RESET = ("state", "reset", *C, "acme-web", "--from")
STATE_CASES = [
    Case("reset-unaligned", None, (*RESET, "2026-01-02T00:30:00Z"), rated=True, names=("--from", "aligned")),
    Case("reset-before-1970", None, (*RESET, "1969-12-31T23:00:00Z"), rated=True, names=("--from",)),
    Case("reset-year-one", None, (*RESET, "0001-01-01T00:00:00Z"), rated=True, names=("--from",)),
    Case("reset-after-2262", None, (*RESET, "2300-01-01T00:00:00Z"), rated=True, names=("--from",)),
    Case("reset-overflow", None, (*RESET, OVERFLOW), rated=True, names=("--from",)),
    Case("reset-garbage", None, (*RESET, "monday"), rated=True, names=("--from", "monday")),
    Case("reset-empty", None, (*RESET, ""), rated=True, names=("--from",)),
    Case("reset-forward", None, (*RESET, "2026-02-01T00:00:00Z"), rated=True,
         names=("--from", "2026-02-01T00:00:00+00:00", "never forward")),
    Case("reset-forward-far", None, (*RESET, "2030-01-01T00:00:00Z"), rated=True, names=("--from", "never forward")),
    Case("reset-unknown-scope", None, ("state", "reset", *C, "acme-typo", "--from", "2026-01-01T00:00:00Z"),
         rated=True, names=("acme-typo",)),
    Case("activate-unknown-scope", None, ("state", "activate", *C, "acme-typo"), rated=True, names=("acme-typo",)),
    Case("deactivate-unknown-scope", None, ("state", "deactivate", *C, "acme-typo"), rated=True,
         names=("acme-typo",)),
    Case("reset-missing-from", None, ("state", "reset", *C, "acme-web"), usage=True, names=("--from",)),
]

MODULE_CASES = [
    Case("priority-huge", None, ("modules", "priority", *C, "hashmap", HUGE), names=("priority", HUGE)),
    Case("priority-huge-negative", None, ("modules", "priority", *C, "hashmap", "-" + HUGE), names=("priority",)),
    Case("priority-int64", None, ("modules", "priority", *C, "hashmap", str(2**63)), names=("priority",)),
    Case("priority-5000-digits", None, ("modules", "priority", *C, "hashmap", "9" * 5000), usage=True,
         names=("priority", "not an integer", "...")),
    Case("priority-text", None, ("modules", "priority", *C, "hashmap", "high"), usage=True, names=("priority",)),
    Case("priority-unknown-module", None, ("modules", "priority", *C, "pyscripts", "1"), usage=True,
         names=("module",)),
    Case("enable-unknown-module", None, ("modules", "enable", *C, "gnocchi"), usage=True, names=("module",)),
]

PATH_CASES = [
    Case("export-missing-directory", None, ("rules", "export", *C, "{ws}/nowhere/rules.json"),
         names=("nowhere/rules.json", "cannot write")),
    Case("export-to-directory", None, ("rules", "export", *C, "{ws}"), names=("{ws}", "cannot write")),
    Case("export-under-a-file", None, ("rules", "export", *C, "{c}/rules.json"), names=("cannot write",)),
    Case("demo-dir-is-file", None, ("demo", "--dir", "{c}"), names=("{c}", "not a directory")),
    Case("demo-dir-under-file", None, ("demo", "--dir", "{c}/demo"), names=("{c}/demo",)),
    Case("config-missing", None, ("run", "-c", "{ws}/nope.yaml"), names=("nope.yaml",)),
    Case("config-is-directory", None, ("modules", "list", "-c", "{ws}"), names=("{ws}",)),
    Case("unknown-command", None, ("rerate",), usage=True, names=("rerate",)),
    Case("no-command", None, (), usage=True, names=("command",)),
]

RUNNER_CASES = [
    Case("runner-missing", None, (*RUN, "--runner-config", "{ws}/nope.yaml"), names=("nope.yaml",)),
    Case("runner-not-utf8", _runner(b"runner: \xff\n"), WITH_RUNNER, names=("runner.yaml", "UTF-8")),
    Case("runner-unknown-option", _runner("runner: DirectRunner\noptions: [--paralelism=4]\n"), WITH_RUNNER,
         names=("runner.yaml", "options[0]", "--paralelism=4")),
    Case("runner-unknown-option-second", _runner("runner: DirectRunner\noptions: [--direct_num_workers=2, --foo]\n"),
         WITH_RUNNER, names=("runner.yaml", "options[1]", "--foo")),
    Case("runner-bad-option-value", _runner("runner: DirectRunner\noptions: [--direct_num_workers=many]\n"),
         WITH_RUNNER, names=("runner.yaml", "options[0]")),
    Case("runner-option-not-flag", _runner("runner: DirectRunner\noptions: [parallelism=4]\n"), WITH_RUNNER,
         names=("runner.yaml", "options")),
    Case("runner-options-string", _runner("runner: DirectRunner\noptions: --a=1\n"), WITH_RUNNER,
         names=("runner.yaml", "options")),
    Case("runner-own-flag", _runner("runner: DirectRunner\noptions: [--runner=FlinkRunner]\n"), WITH_RUNNER,
         names=("runner.yaml", "options[0]", "runner")),
    Case("runner-unknown-runner", _runner("runner: SparkRunner\n"), WITH_RUNNER, names=("runner.yaml", "runner")),
    Case("runner-unknown-key", _runner("runner: DirectRunner\nparallelism: 4\n"), WITH_RUNNER,
         names=("runner.yaml", "parallelism")),
    Case("runner-prism-not-portable", _runner("runner: DirectRunner\nprism: {binary: auto}\n"), WITH_RUNNER,
         names=("runner.yaml", "prism")),
    Case("runner-portable-no-server", _runner("runner: PortableRunner\n"), WITH_RUNNER,
         names=("runner.yaml", "runner")),
    Case("runner-bad-endpoint", _runner("runner: PortableRunner\nprism: {endpoint: 'localhost'}\n"), WITH_RUNNER,
         names=("runner.yaml", "prism.endpoint")),
    Case("runner-loopback-endpoint",
         _runner("runner: PortableRunner\nprism: {binary: auto}\nenvironment: {type: LOOPBACK, endpoint: 'h:1'}\n"),
         WITH_RUNNER, names=("runner.yaml", "environment")),
    Case("runner-deep", _runner("runner: " + "[" * 3000 + "]" * 3000 + "\n"), WITH_RUNNER,
         names=("runner.yaml", "nested too deeply")),
    Case("runner-empty", _runner(""), WITH_RUNNER, names=("runner.yaml",)),
]

DIGITS = "9" * 5000
#: Row ids (dead letters, reprocessing schedules) and the other integer options: a number no
#: column or clock holds is refused in one line; 5,000 digits in a short usage error.
ID_CASES = [
    Case("failures-show-huge", None, ("failures", "show", *C, HUGE), rated=True, names=("id", HUGE)),
    Case("failures-show-zero", None, ("failures", "show", *C, "0"), rated=True, names=("id", "0")),
    Case("failures-show-5000-digits", None, ("failures", "show", *C, DIGITS), usage=True,
         names=("id", "not an integer", "...")),
    Case("failures-clear-huge", None, ("failures", "clear", *C, "1", HUGE, "--yes"), rated=True,
         names=("ID", HUGE)),
    Case("failures-clear-negative", None, ("failures", "clear", *C, "-3", "--yes"), rated=True, names=("ID", "-3")),
    Case("cancel-huge", None, ("reprocess", "cancel", *C, HUGE), rated=True, names=("ID", HUGE)),
    Case("cancel-int64", None, ("reprocess", "cancel", *C, str(2**63)), rated=True, names=("ID",)),
    Case("cancel-5000-digits", None, ("reprocess", "cancel", *C, DIGITS), usage=True,
         names=("ID", "not an integer", "...")),
    Case("backfill-chunk-5000-digits", None, ("backfill", *C, "--from", "2026-01-01", "--to", "2026-01-02",
                                                "--chunk", DIGITS), usage=True, names=("--chunk", "...")),
    Case("reprocess-run-chunk-zero", None, ("reprocess", "run", *C, "--chunk", "0"), rated=True,
         names=("--chunk", "0")),
]

CHART = ("report", "chart", *C, "--output", "{ws}/chart.png")
CHART_CASES = [
    Case("chart-top-5000-digits", None, (*CHART, "--top", DIGITS), usage=True, names=("--top", "...")),
    Case("chart-top-zero", None, (*CHART, "--top", "0"), rated=True, names=("--top", "0")),
    Case("chart-size-huge", None, (*CHART, "--size", "100000x100000"), rated=True, names=("--size", "100000x100000")),
    Case("chart-size-5000-digits", None, (*CHART, "--size", DIGITS + "x10"), rated=True, names=("--size", "...")),
    Case("chart-size-superscript", None, (*CHART, "--size", "\u00b2x1"),
         rated=True, names=("--size",)),
    Case("chart-size-zero", None, (*CHART, "--size", "0x600"), rated=True, names=("--size", "0x600")),
    Case("chart-output-extension", None, ("report", "chart", *C, "--output", "{ws}/chart.gif"), rated=True,
         names=("--output", "chart.gif")),
]

SERVE_NUMBER_CASES = [
    Case("serve-interval-nan", None, ("serve", *C, "--interval", "nan"), names=("--interval", "nan")),
    Case("serve-interval-inf", None, ("serve", *C, "--interval", "1e400"), names=("--interval", "inf")),
    Case("serve-interval-5000-letters", None, ("serve", *C, "--interval", "x" * 5000), usage=True,
         names=("--interval", "not a number", "...")),
    Case("serve-interval-zero", None, ("serve", *C, "--interval", "0"), names=("--interval",)),
    Case("serve-step-huge", None, ("serve", *C, "--now", NOW, "--step", HUGE), names=("--step", HUGE)),
    Case("serve-now-without-ticks", None, ("serve", *C, "--now", NOW), names=("--now", "--ticks", NOW)),
    Case("serve-ticks-huge", None, ("serve", *C, "--ticks", HUGE), names=("--ticks", HUGE)),
    Case("serve-ticks-5000-digits", None, ("serve", *C, "--ticks", DIGITS), usage=True, names=("--ticks", "...")),
    Case("serve-port-huge", None, ("serve", *C, "--metrics-port", "70000"), names=("--metrics-port", "70000")),
    Case("serve-restarts-negative", None, ("serve", *C, "--max-restarts", "-1"), names=("--max-restarts", "-1")),
    Case("serve-stall-zero", None, ("serve", *C, "--stall-timeout", "0"), names=("--stall-timeout", "0")),
    Case("serve-stall-nan", None, ("serve", *C, "--stall-timeout", "nan"), names=("--stall-timeout", "nan")),
]

CASES = (NOW_CASES + SERVE_CASES + REPORT_CASES + STATE_CASES + MODULE_CASES + PATH_CASES + RUNNER_CASES
         + ID_CASES + CHART_CASES + SERVE_NUMBER_CASES)


@pytest.mark.parametrize("case", params(CASES))
def test_refused(case, workspace_for):
    check_refused(case, workspace_for(case))


def test_postgresql_without_its_driver(workspace_for, monkeypatch):
    """A plain install has no psycopg: the URL is refused naming the driver and the extra to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what ``import psycopg`` does when it is absent
    url = "postgresql://u@127.0.0.1:1/db"
    case = Case("no-psycopg", replace("ratebeam.yaml", "sqlite:///ratebeam.db", url), ("db", "upgrade", *C),
                names=(url, "psycopg", "ratebeam[postgresql]"))
    check_refused(case, workspace_for(case))


def test_a_bug_is_one_internal_error_line_with_its_own_status(workspace_for, monkeypatch, caplog):
    """The top-level net: a programming error is said as a bug (status 70), never as bad input."""
    from ratebeam.pipelines.commands import rules
    from ratebeam.pipelines.exit_codes import EXIT_INTERNAL

    def broken(args):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'\nsecond line")

    monkeypatch.setattr(rules, "cmd_modules_list", broken)
    ws = workspace_for(Case("bug", None, ()))
    done = cli("modules", "list", "-c", ws)
    assert done.status == EXIT_INTERNAL == 70
    assert done.err == ("ratebeam: internal error (a bug: please report it; -v shows the traceback): "
                        "TypeError: unsupported operand type(s) for +: 'int' and 'str'\n")
    with caplog.at_level("DEBUG", logger="ratebeam"):
        assert cli("-v", "modules", "list", "-c", ws).status == 70
    assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)  # -v: the traceback


def test_a_polars_panic_is_one_internal_error_line(workspace_for, monkeypatch):
    """A Rust panic is a ``BaseException`` that ``except Exception`` misses: it too is one line, status 70."""
    from decimal import Decimal

    import polars as pl

    from ratebeam.pipelines.commands import rules

    def panics(args):
        pl.Series([Decimal("NaN")], dtype=pl.Decimal(38, 18))  # Polars panics on a NaN decimal

    monkeypatch.setattr(rules, "cmd_modules_list", panics)
    done = cli("modules", "list", "-c", workspace_for(Case("panic", None, ())))
    assert done.status == 70, done.err
    assert done.err.startswith("ratebeam: internal error (a bug: please report it; -v shows the traceback): "
                               "PanicException"), done.err
    assert len(done.err.splitlines()) == 1 and "Traceback" not in done.err


def test_a_keyboard_interrupt_is_not_swallowed(workspace_for, monkeypatch):
    from ratebeam.pipelines.commands import rules

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(rules, "cmd_modules_list", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli("modules", "list", "-c", workspace_for(Case("ctrl-c", None, ())))
