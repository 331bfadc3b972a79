"""The suite's own checks can fail: a command that writes changes the snapshot, a traceback is seen."""

from __future__ import annotations

import pytest

from bad_input.harness import Case, assert_refused, check_refused, cli, snapshot


def test_a_write_to_the_database_changes_the_snapshot(workspace_for):
    ws = workspace_for(Case("write", None, ()))
    before = snapshot(ws.parent)
    assert cli("modules", "priority", "-c", ws, "hashmap", "7").status == 0
    assert snapshot(ws.parent) != before


def test_a_write_to_the_storage_changes_the_snapshot(workspace_for):
    ws = workspace_for(Case("write", None, ()))
    before = snapshot(ws.parent)
    (ws.parent / "rated").mkdir(exist_ok=True)
    (ws.parent / "rated" / "x.parquet").write_bytes(b"PAR1")
    assert snapshot(ws.parent) != before


def test_an_accepted_command_fails_the_check(workspace_for):
    ws = workspace_for(Case("ok", None, ()))
    with pytest.raises(AssertionError):
        check_refused(Case("accepted", None, ("modules", "list", "-c", "{c}")), ws)


def test_a_traceback_fails_the_check(tmp_path):
    from bad_input.harness import Outcome

    with pytest.raises(AssertionError):
        assert_refused(Outcome(2, "", "Traceback (most recent call last):\nratebeam: x\n"),
                       Case("tb", None, ()), tmp_path / "ratebeam.yaml")
