"""``ratebeam failures list|show|clear``: the dead letters after the run that hit them — one row per
frame however many runs it failed, resolved once a later run rates it, cleared only when told."""

from __future__ import annotations

import json

import pytest
from pipeline_support import break_rules_of, fix_rules_of, run_cycle, setup_database, workspace

from ratebeam.pipelines.cli import main


def _list(config, capsys, *extra: str) -> list[dict]:
    assert main(["failures", "list", "-c", str(config), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    """A workspace whose globex frames failed in two runs (a bad tenant rule)."""
    config = workspace(tmp_path_factory.mktemp("stuck") / "ws")
    setup_database(config)
    break_rules_of(config)
    for _ in range(2):
        assert run_cycle(config).returncode == 1
    return config


def test_a_stuck_scope_has_one_row_per_frame_with_its_count(stuck, capsys):
    rows = _list(stuck, capsys)
    assert rows and {r["scope"] for r in rows} == {"globex"}
    assert len({r["period"] for r in rows}) == len(rows)  # two runs, still one row per frame
    assert all(r["failures"] == 2 and r["stage"] == "rate" and r["resolved_at"] is None for r in rows)
    assert all(r["first_seen"] <= r["last_seen"] for r in rows)


def test_list_filters_by_scope_and_since(stuck, capsys):
    assert _list(stuck, capsys, "--scope", "acme-web") == []
    assert len(_list(stuck, capsys, "--scope", "globex", "--scope", "acme-web")) == len(_list(stuck, capsys))
    assert _list(stuck, capsys, "--since", "2999-01-01") == []
    assert main(["failures", "list", "-c", str(stuck), "--since", "yesterday"]) == 2
    assert "--since: not an ISO-8601 date or time: 'yesterday'" in capsys.readouterr().err


def test_list_as_a_table_and_csv(stuck, capsys):
    count = len(_list(stuck, capsys))
    assert main(["failures", "list", "-c", str(stuck)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["id", "scope", "period", "stage", "failures"]
    assert table[-1] == f"({count} dead letter(s), unresolved; --all adds the resolved ones)"
    assert main(["failures", "list", "-c", str(stuck), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "id,scope,period,stage,failures,first_seen,last_seen,resolved_at,reason"
    assert len(lines) == count + 1


def test_show_prints_the_whole_reason(stuck, capsys):
    first = _list(stuck, capsys)[0]
    assert main(["failures", "show", "-c", str(stuck), str(first["id"])]) == 0
    out = capsys.readouterr().out
    assert "scope:        globex" in out and "failures:     2" in out
    assert out.split("reason:\n  ")[1].strip() == first["reason"] and "os_distro" in first["reason"]
    assert main(["failures", "show", "-c", str(stuck), "999999"]) == 2
    assert "id: no dead letter has this id (`ratebeam failures list --all`): 999999" in capsys.readouterr().err


def test_fixed_frames_are_resolved_then_cleared_only_with_yes(tmp_path, capsys):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)
    assert run_cycle(config).returncode == 1
    failed = _list(config, capsys)
    fix_rules_of(config)
    assert run_cycle(config).returncode == 0
    assert _list(config, capsys) == []  # nothing still failing
    resolved = _list(config, capsys, "--all")
    assert [r["id"] for r in resolved] == [r["id"] for r in failed] and all(r["resolved_at"] for r in resolved)

    assert main(["failures", "clear", "-c", str(config)]) == 2
    assert "name what to delete: ID..., --scope, --from, --resolved or --all" in capsys.readouterr().err
    assert main(["failures", "clear", "-c", str(config), "--all"]) == 2
    assert f"would delete {len(resolved)} dead letter(s); nothing was deleted: add --yes" in capsys.readouterr().err
    assert main(["failures", "clear", "-c", str(config), "999999", "--yes"]) == 2
    assert "no such dead letter (nothing was deleted): '999999'" in capsys.readouterr().err
    assert len(_list(config, capsys, "--all")) == len(resolved)
    assert main(["failures", "clear", "-c", str(config), str(resolved[0]["id"]), "--yes"]) == 0
    assert capsys.readouterr().out == "deleted 1 dead letter(s)\n"
    assert main(["failures", "clear", "-c", str(config), "--scope", "globex", "--resolved", "--yes"]) == 0
    assert capsys.readouterr().out == f"deleted {len(resolved) - 1} dead letter(s)\n"
    assert _list(config, capsys, "--all") == []
