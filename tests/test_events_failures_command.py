"""``ratebeam events failures list|show|clear``: the event stream's message dead letters, as the frame ones.

The rows are written as the stream writes them: unreadable bodies recorded by ``Inbox.record``
(one row per body, its deliveries counted) and a notification the definitions refused
(``Inbox.reject``); ``ratebeam failures list`` says they exist.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from events_support import nova
from pipeline_support import setup_database, workspace

from ratebeam.connectors.notifications.envelope import parse
from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config

BODIES = [b"{not json", b'{"event_type": "compute.instance.create.end"}']


def _list(config, capsys, *extra: str) -> list[dict]:
    assert main(["events", "failures", "list", "-c", str(config), "-f", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def letters(tmp_path):
    """A workspace with three message dead letters: two bodies (one delivered twice) and one refused notification."""
    config = workspace(tmp_path / "ws")
    setup_database(config)
    inbox = Inbox(load_config(config, metrics=False).database_url)
    try:
        inbox.record([(b, parse(b)) for b in [BODIES[0], BODIES[0]]], now=datetime(2026, 3, 2, 10, tzinfo=UTC))
        inbox.record([(BODIES[1], parse(BODIES[1]))], now=datetime(2026, 3, 2, 10, 30, tzinfo=UTC))
        inbox.record([(b"{}", nova("compute.instance.create.end", "10:20", message_id="m-1"))],
                     now=datetime(2026, 3, 2, 11, tzinfo=UTC))
        inbox.reject("m-1", "event conversion: memory_mb: not an int: 'lots'", now=datetime(2026, 3, 2, 12, tzinfo=UTC))
    finally:
        inbox.engine.dispose()
    return config


def test_list_shows_every_message_dead_letter_oldest_first_in_each_format(letters, capsys):
    rows = _list(letters, capsys)
    assert [(r["message_id"], r["failures"], r["reason"].split(":")[0]) for r in rows] == [
        (None, 2, "not JSON"), (None, 1, "message_id"), ("m-1", 1, "event conversion")]
    assert all(len(r["id"]) == 12 for r in rows)
    assert _list(letters, capsys, "--since", "2026-03-02T11:00") == rows[2:]
    assert main(["events", "failures", "list", "-c", str(letters)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["id", "message_id", "failures", "received_at", "reason"]
    assert table[-1] == "(3 message dead letter(s))"
    assert main(["events", "failures", "list", "-c", str(letters), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "id,message_id,failures,received_at,reason" and len(lines) == 4


def test_show_prints_the_reason_and_the_body(letters, capsys):
    first = _list(letters, capsys)[0]
    assert main(["events", "failures", "show", "-c", str(letters), first["id"][:6]]) == 0
    out = capsys.readouterr().out
    assert "failures:     2" in out and out.rstrip().endswith("body:\n  {not json")
    assert main(["events", "failures", "show", "-c", str(letters), first["id"], "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["body"] == "{not json"
    assert main(["events", "failures", "show", "-c", str(letters), "beef"]) == 2
    assert "id: no message dead letter has this id (`ratebeam events failures list`): 'beef'" in capsys.readouterr().err
    assert main(["events", "failures", "show", "-c", str(letters), "xyz"]) == 2
    assert "ID: not a dead letter id (hexadecimal" in capsys.readouterr().err


def test_clear_deletes_only_with_yes(letters, capsys):
    rows = _list(letters, capsys)
    assert main(["events", "failures", "clear", "-c", str(letters)]) == 2
    assert "name what to delete: ID..., --from or --all" in capsys.readouterr().err
    assert main(["events", "failures", "clear", "-c", str(letters), "--all"]) == 2
    assert "would delete 3 message dead letter(s); nothing was deleted: add --yes" in capsys.readouterr().err
    assert main(["events", "failures", "clear", "-c", str(letters), "beef", "--yes"]) == 2
    assert "no such message dead letter (nothing was deleted): 'beef'" in capsys.readouterr().err
    assert len(_list(letters, capsys)) == 3
    assert main(["events", "failures", "clear", "-c", str(letters), rows[0]["id"], "--yes"]) == 0
    assert capsys.readouterr().out == "deleted 1 message dead letter(s)\n"
    assert main(["events", "failures", "clear", "-c", str(letters), "--all", "--yes"]) == 0
    assert capsys.readouterr().out == "deleted 2 message dead letter(s)\n"
    assert _list(letters, capsys) == []


def test_failures_list_says_that_message_dead_letters_exist(letters, capsys):
    assert main(["failures", "list", "-c", str(letters)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "(3 message dead letter(s) of the event stream: `ratebeam events failures list`)"
