"""Silent operator mistakes turned into clear errors or warnings: each test asserts the exit status
and the one line an operator reads."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from pipeline_support import counters, ratebeam, run_cycle, setup_database, stored_rows, workspace

from ratebeam.pipelines.cli import main


def _scopes(config, capsys) -> list[str]:
    assert main(["state", "list", "-c", str(config)]) == 0
    return [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]


# --- unknown scopes ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["reset", "nosuch", "--from", "2026-01-03T00:00:00Z"],
                                     ["deactivate", "nosuch"], ["activate", "nosuch"]])
def test_unknown_scope_is_refused_and_not_created(copy, capsys, command):
    before = _scopes(copy, capsys)
    assert main(["state", *command, "-c", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "scope 'nosuch' has no state yet" in err and "--create" in err
    assert _scopes(copy, capsys) == before and "nosuch" not in before


def test_create_makes_the_unknown_scope(copy, capsys):
    assert main(["state", "deactivate", "nosuch", "--create", "-c", str(copy)]) == 0
    assert "scope nosuch: deactivated" in capsys.readouterr().out
    assert "nosuch" in _scopes(copy, capsys)
    assert main(["state", "reset", "other", "--from", "2026-01-03T00:00:00Z", "--create", "-c", str(copy)]) == 0
    assert "scope other: created; next run rates from 2026-01-03T00:00:00+00:00" in capsys.readouterr().out
    assert main(["state", "list", "-c", str(copy)]) == 0
    listing = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert listing["nosuch"][1:] == ["False"]  # created (nothing rated yet), then deactivated
    assert listing["other"][1:3] == ["2026-01-02T23:00:00+00:00", "True"]


# --- report summary --groupby ------------------------------------------------------------------

@pytest.mark.parametrize(("key", "message"), [
    ("foo", "--groupby: unknown key (known: day_of_the_year, id, month, project_id, time, time-d"),
    ("flavor_name", "--groupby: a metadata key (of instance), not a groupby key: summaries group by groupby "
                    "keys only, as CloudKitty's v2 summary does (--filter matches metadata keys too): "
                    "'flavor_name'"),
])
def test_groupby_key_no_point_carries_is_refused(copy, capsys, key, message):
    assert main(["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--groupby", f"type,{key}"]) == 2
    assert message in capsys.readouterr().err


def test_groupby_and_metadata_filter_still_work(copy, capsys):
    args = ["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--format", "json"]
    assert main([*args, "--groupby", "project_id,time-d", "--filter", "flavor_name=m1.small"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert rows and all(row["project_id"] and row["day_of_the_year"] for row in rows)


def test_a_filter_key_or_type_no_metric_has_is_warned_of_and_known_ones_are_not(copy, capsys):
    args = ["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--format", "json"]
    assert main([*args, "--filter", "flavour_name=m1.small", "--type", "instanse"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"] == []
    assert "warning: --filter flavour_name: no metric of metrics.yml has that label (known: " in captured.err
    assert "warning: --type instanse: not a type of metrics.yml (known: instance, ip.floating, volume.size)" in captured.err
    assert main([*args, "--filter", "flavor_name=m1.small", "--filter", "scope_id=acme-web", "--type", "instance"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"] and "warning" not in captured.err


@pytest.mark.parametrize("command", ["summary", "dataframes"])
def test_begin_not_before_end_is_refused(copy, capsys, command):
    window = ["--begin", "2026-01-05", "--end", "2026-01-02"]
    assert main(["report", command, "-c", str(copy), *window]) == 2
    assert ("--begin: must be before --end (2026-01-02T00:00:00+00:00): '2026-01-05T00:00:00+00:00'"
            in capsys.readouterr().err)
    assert main(["report", command, "-c", str(copy), "--begin", "2999-01-01"]) == 2
    assert ", the default: start of next month): '2999-01-01T00:00:00+00:00'" in capsys.readouterr().err


# --- rules import: undeclared groups -----------------------------------------------------------

def test_rules_naming_an_undeclared_group_are_refused(copy, capsys):
    rules = json.loads((copy.parent / "rules.json").read_text())
    rules["services"][0]["fields"][1]["mappings"][0]["group"] = "licence"  # typo of the declared 'license'
    typo = copy.parent / "typo.json"
    typo.write_text(json.dumps(rules))
    assert main(["rules", "export", "-c", str(copy)]) == 0
    before = capsys.readouterr().out
    assert main(["rules", "import", "-c", str(copy), str(typo)]) == 2
    assert (f"{typo}: services[0].fields[1].mappings[0].group: group not declared in the file's 'groups' nor "
            "existing in the database (a new group changes how costs combine: declare it in 'groups'): "
            "'licence'") in capsys.readouterr().err
    assert main(["rules", "export", "-c", str(copy)]) == 0
    assert capsys.readouterr().out == before  # nothing imported


def test_rules_may_use_groups_that_exist_already(copy, capsys):
    rules = json.loads((copy.parent / "rules.json").read_text())
    del rules["groups"]  # 'compute', 'license', ... exist in the database since the first import
    again = copy.parent / "again.json"
    again.write_text(json.dumps(rules))
    assert main(["rules", "import", "-c", str(copy), str(again)]) == 0
    assert "imported 3 service(s)" in capsys.readouterr().out


# --- scripts add: one default start ------------------------------------------------------------

def test_scripts_start_in_1970_like_rules_and_keep_their_start_when_re_added(copy, capsys, tmp_path):
    script = tmp_path / "fee.json"
    script.write_text(json.dumps({"name": "fee", "steps": [{"set": "price", "expr": "price + 0.01"}]}))
    assert main(["scripts", "add", "-c", str(copy), str(script)]) == 0
    assert "script 'fee' saved (1 step(s)), valid from 1970-01-01T00:00:00+00:00" in capsys.readouterr().out
    assert main(["scripts", "add", "-c", str(copy), str(script), "--start", "2026-01-02"]) == 0
    assert "valid from 2026-01-02T00:00:00+00:00" in capsys.readouterr().out
    assert main(["scripts", "add", "-c", str(copy), str(script)]) == 0  # re-added: the start stays
    assert "valid from 2026-01-02T00:00:00+00:00" in capsys.readouterr().out
    assert main(["scripts", "add", "-c", str(copy), str(script), "--end", "2026-01-01"]) == 2
    assert ("command line: --end: script 'fee': end 2026-01-01T00:00:00+00:00 is not after start "
            "2026-01-02T00:00:00+00:00") in capsys.readouterr().err


# --- run: nothing rated, nothing collected -----------------------------------------------------

def test_run_warns_when_no_rating_module_is_enabled(tmp_path):
    config = workspace(tmp_path / "ws")
    assert ratebeam("db", "upgrade", "-c", str(config)).returncode == 0  # no rules import: hashmap has no state
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    assert ("warning: no rating module is enabled (only noop): every point is rated 0; enable one with "
            "`ratebeam modules enable hashmap`") in done.stderr
    assert "collected 0 points" not in done.stderr


def test_run_warns_when_it_collected_no_point(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    usage = config.parent / "usage.csv"
    usage.write_text(usage.read_text().splitlines()[0] + "\n")  # the header only
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    assert "warning: 288 period(s) were due but the run collected 0 points" in done.stderr
    assert "no rating module is enabled" not in done.stderr


# --- the catch-up cap --------------------------------------------------------------------------

def test_periods_left_counts_what_due_periods_would_yield():
    from datetime import UTC, datetime, timedelta

    from ratebeam.transforms.periods import due_periods, periods_left

    last = datetime(2026, 1, 1, tzinfo=UTC)
    for minutes in range(0, 600, 17):
        now = last + timedelta(hours=2, minutes=minutes)
        assert periods_left(last, now, 3600, 2) == len(list(due_periods(last, now, 3600, 2)))


def test_run_says_how_many_periods_the_cap_left(tmp_path):
    config = workspace(tmp_path / "ws", max_periods_per_run=10)
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    assert counters(done.stdout)["due"] == 40  # 4 scopes x 10
    assert ("max_periods_per_run (10 per scope) capped this run: 248 more period(s) are due; the next run "
            "continues from there") in done.stderr


# --- a missing collector file ------------------------------------------------------------------

def test_missing_collector_file_is_one_configuration_error_at_start(tmp_path):
    config = workspace(tmp_path / "ws", collector={"backend": "file", "url": "nosuch.csv"})
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"ratebeam: file collector: {str(config.parent / 'nosuch.csv')!r} "
                                                "does not exist"]  # before any lease or period
    listing = ratebeam("state", "list", "-c", str(config))
    assert listing.stdout.splitlines()[2:] == []  # no scope was leased or rated


# --- metrics.yml: validated only where needed --------------------------------------------------

def _empty_store(config) -> None:
    """Create the workspace's (first) storage, empty, whatever its backend: what a run's ``init`` makes."""
    from ratebeam.connectors.registry import make_backend
    from ratebeam.pipelines.config import load_config

    loaded = load_config(config, metrics=False)
    backend = make_backend(loaded.storage[0], loaded.scope_key)
    try:
        backend.init()
    finally:
        backend.close()


def test_a_broken_metrics_yml_blocks_only_the_commands_that_read_it(tmp_path, capsys):
    config = workspace(tmp_path / "ws")
    (config.parent / "metrics.yml").write_text("metrics: {cpu: {unit: u, mutate: MAP}}\n")
    _empty_store(config)  # as after a run (a missing store is an error of its own)
    rules = str(config.parent / "rules.json")
    for args in (["db", "upgrade"], ["rules", "import", rules], ["modules", "list"], ["state", "list"],
                 ["storage", "info"], ["report", "dataframes", "--begin", "2026-01-01"]):
        assert main([*args[:2], "-c", str(config), *args[2:]]) == 0, args
    capsys.readouterr()
    for args in (["run"], ["report", "summary"]):
        assert main([*args, "-c", str(config)]) == 2
        assert "metrics.yml: metrics.cpu.mutate_map: required when mutate is MAP" in capsys.readouterr().err


def test_a_string_mutate_map_key_is_a_warning_and_never_matches_as_in_cloudkitty(tmp_path):
    config = workspace(tmp_path / "ws")
    metrics = config.parent / "metrics.yml"
    ip = "    alt_name: ip.floating\n    unit: ip\n    groupby: [id, project_id]\n    mutate: NUMBOOL\n"
    assert ip in metrics.read_text()
    # '1' (quoted) is valid for CloudKitty and never matches; the number 1 does (every sample is 1).
    # The string comes last: read as a number, it would win (5), so the test can fail.
    metrics.write_text(metrics.read_text().replace(ip, ip.replace("NUMBOOL", "MAP\n    mutate_map: {1: 3, '1': 5}")))
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    assert (f"WARNING ratebeam.pipelines.metrics_config: {metrics}: metrics.openstack_neutron_floating_ip."
            "mutate_map.1: a string key never matches a quantity (CloudKitty looks the quantity up as a number): "
            "ignored, as CloudKitty does; write it unquoted") in done.stderr
    qty = stored_rows(config).filter(type="ip.floating")["qty"]
    assert len(qty) > 0 and set(qty.to_list()) == {Decimal(3)}


# --- make demo keeps the user's edits ----------------------------------------------------------

def test_demo_keeps_edited_files_and_says_so(tmp_path):
    from ratebeam.pipelines.demo import prepare

    workdir = tmp_path / "demo"
    config = prepare(workdir)
    rules = workdir / "rules.json"
    edited_rules = rules.read_text().replace('"cost": "0.02"', '"cost": "0.025"')
    rules.write_text(edited_rules)
    edited_config = config.read_text() + "# my note\n"
    config.write_text(edited_config)
    done = ratebeam("demo", "--dir", str(workdir))
    assert done.returncode == 0, done.stderr
    assert f"ratebeam demo: keeping your {rules} (delete it to get the shipped one back)" in done.stderr
    assert f"ratebeam demo: keeping your {config} (delete it" in done.stderr
    assert rules.read_text() == edited_rules and config.read_text() == edited_config


def test_demo_refuses_an_edited_rules_file_naming_an_undeclared_group(tmp_path):
    from ratebeam.pipelines.demo import prepare

    workdir = tmp_path / "demo"
    prepare(workdir)
    rules = workdir / "rules.json"
    text = rules.read_text()
    assert '"group": "network"' in text
    rules.write_text(text.replace('"group": "network"', '"group": "netwrk"'))
    done = ratebeam("demo", "--dir", str(workdir))
    assert done.returncode == 2, done.stderr
    assert "group not declared" in done.stderr and "'netwrk'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (workdir / "rated").exists()  # nothing rated


# --- report | head -----------------------------------------------------------------------------

def test_report_into_a_closed_pipe_prints_no_traceback(copy):
    import subprocess

    from pipeline_support import RATEBEAM

    report = subprocess.Popen([*RATEBEAM, "report", "dataframes", "-c", str(copy), "--begin", "2026-01-01",
                               "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert report.stdout.readline() == b"{\n"  # then the reader goes away, as `head -1` does
    report.stdout.close()
    stderr = report.stderr.read().decode()
    assert report.wait(timeout=120) == 141, stderr
    assert stderr == ""
