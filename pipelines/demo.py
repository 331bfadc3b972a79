"""``ratebeam demo``: the whole cycle on the embedded default, with data shipped in the package.

Four projects, three days of hourly usage (instance uptime by flavor and OS, volume sizes in bytes
converted to GiB, floating IPs), CloudKitty-style metrics.yml and hashmap rules — rated from usage
files into a Delta Lake table (the embedded default) through the real pipeline, then summarised per
scope and per type.  Running it again rates nothing new (every period is committed) and prints the
same summary.

The shipped usage covers 2026-01-01 to 2026-01-04; the demo's copy is moved in time (whole days)
so that its data end today, two periods or more before now (``--now``: another instant): the
default window of every report (this month) shows it and a plain ``ratebeam run`` in the workspace
rates only the hours since, so every command works there without dates.  Early in a month the data start at the month's first hour instead
(a scope never rated starts at its month's start) and its last hours become due as time passes.
"""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.runners.config import RunnerConfig

DATA_FILES = ("metrics.yml", "rules.json", "usage.csv")
SCOPES = ("acme-web", "acme-data", "globex", "initech")
#: The shipped data covers 2026-01-01T00:00Z to 2026-01-04T00:00Z; two periods later everything is due.
DEMO_NOW = datetime(2026, 1, 4, 2, 0, tzinfo=UTC)
DEMO_BEGIN = datetime(2026, 1, 1, tzinfo=UTC)
DEMO_END = datetime(2026, 2, 1, tzinfo=UTC)
#: The shipped usage's column of instants (moved by ``shift_of``).
TIMESTAMP = "timestamp"

CONFIG = """\
# Written by `ratebeam demo`: the embedded default (no server): usage files -> a Delta Lake table.
database_url: sqlite:///ratebeam.db
period: 3600
wait_periods: 2
scope_key: project_id
metrics: metrics.yml
fetcher:
  backend: source
  scopes: [{scopes}]
collector:
  backend: file
  url: usage.csv
storage:
  backends:
    - backend: delta
      url: rated
"""


def shift_of(now: datetime) -> timedelta:
    """How far the demo moves the shipped usage: whole days, so its data end today, two periods or more before ``now``.

    Whole days keep the usage's days and hours of the day (a ``--groupby time-d`` shows three days).

    Never before the month of ``now`` starts: a scope never rated is rated from its month's start.
    """
    from ratebeam.transforms.periods import month_start

    day = (now - (DEMO_NOW - DEMO_NOW.replace(hour=0))).astimezone(UTC).replace(hour=0, minute=0, second=0,
                                                                               microsecond=0)
    return max(day - DEMO_NOW.replace(hour=0), month_start(now) - DEMO_BEGIN)


def _copy_shifted(source: Path, target: Path, shift: timedelta) -> None:
    """The usage CSV with every instant moved by ``shift``."""
    import csv

    with open(source, newline="", encoding="utf-8") as src, open(target, "w", newline="", encoding="utf-8") as out:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(out, fieldnames=reader.fieldnames or [], lineterminator="\n")
        writer.writeheader()
        for row in reader:
            moment = datetime.fromisoformat(row[TIMESTAMP].replace("Z", "+00:00")) + shift
            writer.writerow(row | {TIMESTAMP: moment.strftime("%Y-%m-%dT%H:%M:%SZ")})


def _usage_window(usage: Path, period: int) -> tuple[datetime, datetime]:
    """The periods the workspace's usage file covers (it may be one a former demo moved, kept)."""
    import csv

    try:
        with open(usage, newline="", encoding="utf-8") as src:
            moments = [datetime.fromisoformat(row[TIMESTAMP].replace("Z", "+00:00")) for row in csv.DictReader(src)]
    except (OSError, KeyError, ValueError, TypeError):  # an edited file the cycle read another way
        moments = []
    if not moments:
        return DEMO_BEGIN, DEMO_END
    step = timedelta(seconds=period)
    first = min(moments)
    return first - timedelta(seconds=first.timestamp() % period), max(moments) + step


def prepare(workdir: Path, shift: timedelta | None = None) -> Path:
    """Copy the sample data into ``workdir`` and write its ratebeam.yaml; returns the config path.

    ``shift`` moves the usage's instants (``run_demo``: ``shift_of(now)``); without, they are the shipped ones.

    A file already there is kept (and said so on stderr): the user may have edited the rules or
    the configuration to try something, and running the demo again must not undo that silently.
    """
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir(exist_ok=True) says so of a file, or of a file on the way
        raise InputError(str(workdir), "", "exists and is not a directory") from None
    except OSError as exc:
        raise InputError(str(workdir), "", f"cannot create the demo directory: {exc.strerror or exc}") from None
    source = resources.files("ratebeam.pipelines") / "demo_data"
    for name in DATA_FILES:
        if not _kept(workdir / name):
            with resources.as_file(source / name) as path:
                if shift is not None and name == "usage.csv":
                    _copy_shifted(path, workdir / name, shift)
                else:
                    shutil.copyfile(path, workdir / name)
    config_path = workdir / "ratebeam.yaml"
    if not _kept(config_path):
        config_path.write_text(CONFIG.format(scopes=", ".join(SCOPES)), encoding="utf-8")
    return config_path


def _kept(path: Path) -> bool:
    """Whether ``path`` exists already (then it is kept, and the user told how to get the sample back)."""
    if not path.exists():
        return False
    print(f"ratebeam demo: keeping your {path} (delete it to get the shipped one back)", file=sys.stderr)
    return True


def run_demo(workdir: Path, runner_config: RunnerConfig | None = None, now: datetime | None = None) -> int:
    """Set up, rate on ``runner_config``'s runner (default FnApiRunner) at ``now`` (default: the clock), summarise.

    Exit status 0 when every due period was rated.
    """
    from ratebeam.connectors.sql import rules_repository
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.migrations import upgrade
    from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset
    from ratebeam.pipelines.commands.run import run_configured_cycle
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.interchange import read_rules

    now = now or datetime.now(UTC)
    shift = shift_of(now)
    config = load_config(prepare(workdir, shift))
    engine = make_engine(config.database_url)
    upgrade(engine)
    # A rules file the user edited may name a group by mistake: refused as ``rules import`` does.
    known = rules_repository.load_rules(engine).groups
    rules_repository.replace_rules(engine, read_rules(workdir / "rules.json", known_groups=known))
    enable_hashmap_if_unset(engine)
    engine.dispose()
    report = run_configured_cycle(config, now, runner_config)
    print_summary(config, *_usage_window(workdir / "usage.csv", config.period))
    prog = "ratebeam" if shutil.which("ratebeam") else sys.argv[0]  # e.g. .venv/bin/ratebeam under make
    print(f"\nThe demo lives in {workdir}/ (ratebeam.yaml, rated/ Delta table, ratebeam.db). Try:\n"
          f"  {prog} report summary -c {workdir}/ratebeam.yaml --groupby type,time-d\n"
          f"  {prog} report dataframes -c {workdir}/ratebeam.yaml --scope globex --limit 5")
    return EXIT_OK if report.ok else EXIT_FAILED


def print_summary(config: RatebeamConfig, begin: datetime = DEMO_BEGIN, end: datetime = DEMO_END,
                  out: TextIO | None = None) -> None:
    """Cost per scope and type, then per scope, then the grand total, read back from storage."""
    from ratebeam.connectors.registry import make_backend
    from ratebeam.connectors.storage.base import TotalQuery
    from ratebeam.pipelines.commands.common import print_table
    from ratebeam.pipelines.interchange import plain_decimal

    out = out or sys.stdout
    backend = make_backend(config.storage[0])
    backend.init()
    try:
        def total(groupby: tuple[str, ...]) -> list[dict]:
            query = TotalQuery(groupby=groupby, begin=begin, end=end, limit=10_000)
            return backend.total(query).results

        key = config.scope_key
        print(f"\nCost per scope and type ({begin.date().isoformat()} to {end.date().isoformat()}):", file=out)
        print_table(total((key, "type")), [key, "type", "qty", "rate"], out)
        print("\nCost per scope:", file=out)
        print_table(total((key,)), [key, "rate"], out)
        grand = total(())
        print(f"\nTotal: {plain_decimal(grand[0]['rate']) if grand else 0}", file=out)
    finally:
        backend.close()
