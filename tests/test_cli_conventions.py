"""The CLI's conventions: ``--format`` on every listing and report, ``--version``, help with defaults,
the log level (quiet on a terminal) and the progress of a run (a bar on a terminal, lines otherwise)."""

from __future__ import annotations

import argparse
import csv
import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import termios
from importlib.metadata import version

import pytest
from pipeline_support import NOW, RATEBEAM, leaf_parsers, ratebeam

from ratebeam.pipelines.cli import build_parser, main
from ratebeam.pipelines.commands.progress import progress

# ---- --format: the same rows as a table, as JSON and as CSV ----

LISTINGS = [
    ("rules", "list"),
    ("state", "list"),
    ("modules", "list"),
    ("scripts", "list"),
    ("storage", "info"),
    ("report", "summary", "--begin", "2026-01-01", "--groupby", "type,project_id"),
    ("report", "dataframes", "--begin", "2026-01-01", "--limit", "50"),
]


def parse_table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """The rows of an aligned table, cut at the columns its dashes line marks (cells may be empty)."""
    lines = text.splitlines()
    spans, start = [], 0
    for dashes in lines[1].split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    header = [lines[0][a:b].strip() for a, b in spans]
    rows = [{h: line[a:b].strip() for h, (a, b) in zip(header, spans, strict=True)}
            for line in lines[2:] if not line.startswith("(")]  # the "(N row(s))" footer
    return header, rows


def _text(value) -> str:
    """A JSON value as the table shows it."""
    return "" if value is None else str(value)


def _output(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", LISTINGS, ids=lambda c: " ".join(c[:2]))
def test_every_listing_gives_the_same_rows_as_table_json_and_csv(copy, capsys, command):
    scripted = copy.parent / "script.json"
    scripted.write_text(json.dumps({"name": "double", "steps": [{"set": "price", "expr": "price * 2"}]}))
    assert main(["scripts", "add", "-c", str(copy), str(scripted)]) == 0
    base = [*command, "-c", str(copy)]
    capsys.readouterr()
    header, table = parse_table(_output(capsys, *base))
    assert table, "the demo workspace has rows for every listing"
    assert _output(capsys, *base, "--format", "table") == _output(capsys, *base)
    rows = list(csv.DictReader(io.StringIO(_output(capsys, *base, "--format", "csv"))))
    assert rows == table
    document = json.loads(_output(capsys, *base, "--format", "json"))
    if command[:2] == ("report", "dataframes"):  # CloudKitty's /v2/dataframes shape: count the points
        assert document["total"] >= len(table)
        assert sum(len(frame["usage"][t]) for frame in document["dataframes"] for t in frame["usage"]) == len(table)
        return
    if command[:2] == ("report", "summary"):  # CloudKitty's /v2/summary shape
        assert document["total"] == len(table)
        document = document["results"]
    assert [{h: _text(row[h]) for h in header} for row in document] == table


def test_machine_formats_keep_exact_decimals_and_utc_instants(copy, capsys):
    summary = json.loads(_output(capsys, "report", "summary", "-c", str(copy), "--begin", "2026-01-01",
                                 "--format", "json"))
    assert isinstance(summary["results"][0]["rate"], str)  # a decimal string, never a float
    assert summary["results"][0]["begin"] == "2026-01-01T00:00:00+00:00"
    states = list(csv.DictReader(io.StringIO(_output(capsys, "state", "list", "-c", str(copy), "-f", "csv"))))
    assert states and all(s["last_processed"].endswith("+00:00") for s in states)
    costs = {r["cost"] for r in csv.DictReader(io.StringIO(_output(capsys, "rules", "list", "-c", str(copy),
                                                                   "-f", "csv")))}
    assert costs and not any("E" in c or "e" in c for c in costs)  # plain decimals, no exponent


def test_csv_through_a_pipe_closed_early_is_no_traceback(copy):
    reader = subprocess.Popen([*RATEBEAM, "report", "dataframes", "-c", str(copy), "--begin", "2026-01-01",
                               "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = reader.stdout.readline()
    reader.stdout.close()  # the reader is gone, as with `| head -1`
    reader.wait(timeout=120)
    assert first.decode().startswith("begin,scope_id,type,qty,unit,price")
    assert b"Traceback" not in reader.stderr.read()


# ---- --version and help ----


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"ratebeam {version('ratebeam')}\n"


def _help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit):
        main([*args, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width


def test_help_shows_the_defaults(capsys):
    text = _help(capsys, "report", "dataframes")
    assert "--limit LIMIT at most this many rows (pagination) (default: 1000)" in text
    assert "--offset OFFSET skip this many rows (pagination) (default: 0)" in text
    assert "(default: table)" in text
    assert "(default: None)" not in text
    assert "where to write it (-: stdout) (default: -)" in _help(capsys, "rules", "export")


def test_top_level_help_has_no_raw_markup(capsys):
    text = _help(capsys)
    assert text.startswith("usage: ratebeam") and "The ratebeam command line" in text
    for marker in ("``", "%(", ":func:", ":class:"):
        assert marker not in text


def test_every_argument_of_every_command_has_help():
    parser = build_parser()
    silent = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    for leaf in [parser, *leaf_parsers(parser)]:
        for action in leaf._actions:
            if not isinstance(action, silent):
                assert action.help and action.help != argparse.SUPPRESS, (leaf.prog, action.dest)


def test_every_option_with_a_default_says_it():
    """An option whose default is a value (not None, off or an empty list) names it in its help."""
    parser = build_parser()
    silent = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    for leaf in [parser, *leaf_parsers(parser)]:
        formatter = leaf._get_formatter()
        for action in leaf._actions:
            if isinstance(action, silent) or action.default in (None, False, [], argparse.SUPPRESS):
                continue
            assert "default" in formatter._get_help_string(action), (leaf.prog, action.dest, action.default)


# ---- the log level and the progress of a run ----


def on_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal (120 columns); returns its status and stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([*RATEBEAM, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env={**os.environ, **(env or {})})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


def _reset(config) -> None:
    done = ratebeam("state", "reset", "-c", str(config), "globex", "--from", "2026-01-03T00:00:00Z", "--yes")
    assert done.returncode == 0, done.stderr


def test_a_terminal_sees_no_info_lines_but_a_progress_bar(copy):
    _reset(copy)
    status, stderr = on_terminal("run", "-c", str(copy), "--now", NOW, env={"RATEBEAM_LOG_LEVEL": ""})
    assert status == 0, stderr
    assert " INFO " not in stderr
    assert "24/24" in stderr and "100%|" in stderr  # tqdm's bar, at its end
    assert "periods: 24 due" not in stderr  # the summary is on stdout (a log line it is not)


def test_a_terminal_asking_for_info_gets_it(copy):
    status, stderr = on_terminal("--log-level", "info", "run", "-c", str(copy), "--now", NOW)
    assert status == 0, stderr
    assert " INFO ratebeam.connectors.fetchers.fetch_transform: fetched 4 scope(s)" in stderr


def test_a_pipe_gets_info_lines_and_plain_progress_lines(copy):
    _reset(copy)
    done = ratebeam("run", "-c", str(copy), "--now", NOW, env={"RATEBEAM_LOG_LEVEL": ""})
    assert done.returncode == 0, done.stderr
    assert " INFO " in done.stderr and "period(s) due from 2026-01-03T00:00:00" in done.stderr
    progress_lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam run: progress: ")]
    assert progress_lines[-1].startswith("ratebeam run: progress: 24/24 period(s) in ")
    assert "\r" not in done.stderr and "%|" not in done.stderr


def test_the_log_level_from_the_environment_or_the_command(copy):
    quiet = ratebeam("run", "-c", str(copy), "--now", NOW, env={"RATEBEAM_LOG_LEVEL": "WARNING"})
    assert quiet.returncode == 0 and " INFO " not in quiet.stderr, quiet.stderr
    loud = ratebeam("run", "-c", str(copy), "--now", NOW, "--log-level", "INFO", env={"RATEBEAM_LOG_LEVEL": "ERROR"})
    assert loud.returncode == 0 and " INFO " in loud.stderr, loud.stderr  # the flag wins over the environment


def test_a_bad_log_level_in_the_environment_is_one_clear_line(copy):
    done = ratebeam("state", "list", "-c", str(copy), env={"RATEBEAM_LOG_LEVEL": "LOUD"})
    assert done.returncode == 2
    assert done.stderr.strip() == ("ratebeam: environment: RATEBEAM_LOG_LEVEL: not a log level "
                                   "(one of DEBUG, INFO, WARNING, ERROR): 'LOUD'")


def test_plain_progress_lines_count_work_found_on_the_way():
    out = io.StringIO()
    with progress(None, "period", desc="work", stream=out, interval=0) as shown:
        shown.add_total(3)
        shown.advance()
        shown.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["work: 0/3 period(s)", "work: 1/3 period(s)", "work: 3/3 period(s)"]
    assert lines[3].startswith("work: 3/3 period(s) in ")


def test_progress_that_failed_prints_no_final_line():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress(5, "item", desc="work", stream=out) as shown:
        shown.advance()
        raise RuntimeError("stop")
    assert out.getvalue() == ""  # the error says the rest; no "done" line


def test_the_writers_render_a_cell_alike_in_every_format():
    from datetime import datetime, timedelta, timezone
    from decimal import Decimal

    from ratebeam.pipelines.commands.output import VALUE, write_rows

    paris = timezone(timedelta(hours=1))
    rows = [{"id": "a", "cost": Decimal("0.0100"), "at": datetime(2026, 1, 1), "until": None},  # noqa: DTZ001 (naive, as SQLite gives: UTC)
            {"id": "b", "cost": Decimal("1E+3"), "at": datetime(2026, 1, 1, 1, tzinfo=paris), "until": None}]
    columns = ["id", "cost", "at", "until"]
    out = {}
    for fmt in ("json", "csv", VALUE):
        out[fmt] = io.StringIO()
        write_rows(rows, columns, fmt, out[fmt])
    at = "2026-01-01T00:00:00+00:00"
    assert out[VALUE].getvalue() == f"a 0.01 {at} \nb 1000 {at} \n"
    assert json.loads(out["json"].getvalue()) == [{"id": "a", "cost": "0.01", "at": at, "until": None},
                                                   {"id": "b", "cost": "1000", "at": at, "until": None}]
    assert out["csv"].getvalue() == f"id,cost,at,until\na,0.01,{at},\nb,1000,{at},\n"
