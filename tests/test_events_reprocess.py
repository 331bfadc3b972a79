"""``ratebeam events reprocess``: the inbox replayed in event-time order, the frames of a range stored again.

The inbox holds the notifications of ``tests/test_events_stream.py`` (the issue's worked example,
a volume, a floating IP and Nova's audit of vm-3, in the oslo v1 envelope as the bus delivers it),
recorded by ``Inbox.record`` as the stream's source records them; the straggler (vm-1 resized to
m1.large at 12:10, after the stream had billed vm-1) is marked late as the stream marks it.  No
broker or job server is needed: the replay is a bounded job on FnApiRunner.  Expected rows are the
hand computation of the stream test, with the straggler billed at its own time.
"""

from __future__ import annotations

import json
from decimal import Decimal

import polars as pl
import pytest
import sqlalchemy as sa
import yaml
from pipeline_support import ratebeam, stored_rows
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)
from test_events_stream import (
    AUDIT_TENANT,
    CLOCK,
    EXPECTED,
    STRAGGLER,
    TENANT,
    at,
    events_workspace,
    lifecycle_messages,
)

from ratebeam.connectors.notifications.envelope import parse
from ratebeam.connectors.notifications.inbox import Inbox
from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.models import EventFrame, EventInbox
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config

#: The straggler billed at its own time: 12:00-12:10 still m1.medium, 12:10-12:40 m1.large.
WITH_STRAGGLER = [row for row in EXPECTED if row[:2] != ("instance", "12:00")] + [
    ("instance", "12:00", "m1.medium", 600, Decimal("0.015")),
    ("instance", "12:00", "m1.large", 1800, Decimal("0.09")),
]
#: vm-3 (audited from 11:00, alive): one hour of m1.small in each period of the range after it.
AUDITED_TO_13 = [("instance", hhmm, "m1.small", 3600, Decimal("0.045")) for hhmm in ("11:00", "12:00")]


def v1_body(msg: dict) -> bytes:
    """The oslo v1 envelope of ``msg`` (the context's keys prefixed ``_context_``)."""
    return json.dumps({**msg, "_context_project_id": TENANT, "_context_request_id": f"req-{msg['message_id']}"}).encode()


def record(config, items, late: bool = False) -> None:
    inbox = Inbox(load_config(config, metrics=False).database_url)
    try:
        bodies = [v1_body(msg) for _, _, msg in items]
        inbox.record([(body, parse(body)) for body in bodies])
        for _, _, msg in items if late else ():
            inbox.late(msg["message_id"], "came after its instance fired (as the stream records it)")
    finally:
        inbox.engine.dispose()


def reprocess(config, *args: str) -> int:
    return main(["events", "reprocess", "-c", str(config), "--from", at("10:00").isoformat(),
                 "--to", at("13:00").isoformat(), *args])


def table(rows: pl.DataFrame, scope: str) -> list[tuple]:
    return sorted((r["type"], r["begin"].strftime("%H:%M"), r.get("groupby.flavor_name") or "",
                   Decimal(r["qty"]), Decimal(r["price"]))
                  for r in rows.filter(pl.col("scope_id") == scope).iter_rows(named=True))


def want(expected: list[tuple]) -> list[tuple]:
    return sorted((t, begin, flavor, Decimal(qty), price) for t, begin, flavor, qty, price in expected)


def inbox_workspace(root):
    """A workspace whose inbox holds the stream test's notifications, the straggler recorded late."""
    config = events_workspace(root, "amqp://guest:guest@127.0.0.1:1//", "unused")  # the bus is not used
    record(config, [*lifecycle_messages(), CLOCK])
    record(config, [STRAGGLER], late=True)
    return config


@pytest.fixture
def config(tmp_path):
    return inbox_workspace(tmp_path / "ws")


def test_the_straggler_the_stream_left_out_is_billed_at_its_own_time(config, capsys):
    assert reprocess(config) == 0
    said = capsys.readouterr().err
    # the 8 of the lifecycles and the straggler; the clock (15:30) is past the range + fire_delay
    assert "replaying 9 notification(s) up to 2026-03-02T14:00:00+00:00 (1 recorded late by the stream)" in said
    # 3 periods x 2 scopes (t-1, t-3); 8 + 2 rows
    assert ("2026-03-02T10:00:00+00:00 to 2026-03-02T13:00:00+00:00: 6 frame(s) of 2 scope(s) stored again "
            "(10 point(s), 0 stale type(s) deleted), 0 failed") in said, said
    rows = stored_rows(config)
    assert table(rows, TENANT) == want(WITH_STRAGGLER)
    assert table(rows, AUDIT_TENANT) == want(AUDITED_TO_13)
    assert set(rows["scope_id"].to_list()) == {TENANT, AUDIT_TENANT}  # vm-2's 15:30 create is past the range
    assert sum(rows.filter(pl.col("scope_id") == TENANT)["price"].to_list(), Decimal(0)) == Decimal("0.23325")


def bookkeeping(config) -> tuple[list, list]:
    """The inbox's rows (id, finished, late, read by) and the frames recorded as the stream's."""
    engine = make_engine(load_config(config, metrics=False).database_url)
    try:
        with engine.connect() as conn:
            inbox = conn.execute(sa.select(EventInbox.message_id, EventInbox.finished_at, EventInbox.late_at,
                                           EventInbox.emitted_run, EventInbox.finish_scope)
                                 .order_by(EventInbox.message_id)).all()
            frames = conn.execute(sa.select(EventFrame.scope, EventFrame.period_begin)).all()
    finally:
        engine.dispose()
    return inbox, frames


def test_the_stream_s_bookkeeping_is_left_as_it_was(config):
    """Nothing finished, marked late or read in the inbox; no frame recorded as the stream's (it still writes them)."""
    before = bookkeeping(config)
    assert reprocess(config) == 0
    assert not stored_rows(config).is_empty()
    assert bookkeeping(config) == before
    assert before[1] == []


def test_a_second_reprocess_stores_the_same_rows_once(config):
    assert reprocess(config) == 0
    first = stored_rows(config)
    assert reprocess(config) == 0
    assert stored_rows(config).equals(first)


def test_a_frame_whose_usage_is_gone_is_emptied_and_other_scopes_are_left_alone(tmp_path, capsys):
    """The floating IP's delete reaches the inbox after a first reprocess: the IP, open until then,
    was billed 10:10-13:00; the second reprocess of that scope alone leaves 10:10-10:50."""
    config = events_workspace(tmp_path / "ws", "amqp://guest:guest@127.0.0.1:1//", "unused")
    messages = lifecycle_messages()
    ip_delete = [m for m in messages if m[2]["event_type"] == "floatingip.delete.end"]
    record(config, [m for m in messages if m not in ip_delete])
    assert reprocess(config) == 0
    ips = stored_rows(config).filter(pl.col("type") == "ip.floating")
    assert sorted(ips["qty"].cast(pl.Float64).to_list()) == [3000.0, 3600.0, 3600.0]  # 10:10-11:00, 11:00, 12:00
    audited = table(stored_rows(config), AUDIT_TENANT)
    record(config, ip_delete)
    capsys.readouterr()
    assert reprocess(config, "--scope", TENANT) == 0
    assert "3 frame(s) of 1 scope(s) stored again (7 point(s), 2 stale type(s) deleted)" in capsys.readouterr().err
    rows = stored_rows(config)
    assert table(rows, TENANT) == want(EXPECTED)
    assert table(rows, AUDIT_TENANT) == audited


def test_a_reprocess_killed_between_two_writes_then_run_again_stores_the_clean_rows(tmp_path):
    """SIGKILL at the second frame write (``RATEBEAM_FAILPOINT``), then the same command again: the
    rows of a reprocess that was never killed, each once."""
    clean, killed = inbox_workspace(tmp_path / "clean"), inbox_workspace(tmp_path / "killed")
    for config in (clean, killed):  # batches are cut between frames: one write per frame, six in all
        doc = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**doc, "rebatch_rows": 1}))
    assert reprocess(clean) == 0
    args = ["events", "reprocess", "-c", str(killed), "--from", at("10:00").isoformat(), "--to", at("13:00").isoformat()]
    died = ratebeam(*args, env={"RATEBEAM_FAILPOINT": "write:2"})
    assert died.returncode == -9, died.stderr[-3000:]
    assert 0 < stored_rows(killed).height < stored_rows(clean).height  # killed between two writes
    done = ratebeam(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stored_rows(killed).equals(stored_rows(clean))


def test_a_scope_without_notifications_is_said_and_nothing_is_stored(config, capsys):
    assert reprocess(config, "--scope", "nobody") == 0
    err = capsys.readouterr().err
    assert "0 frame(s) of 0 scope(s) stored again" in err
    assert ("warning: 1 of the --scope values have no notification in the inbox up to 2026-03-02T14:00:00+00:00: "
            "nothing was stored for them") in err, err
    assert stored_rows(config).is_empty()


@pytest.mark.parametrize(("args", "message"), [
    (["--from", "2026-03-02T10:30:00Z", "--to", "2026-03-02T13:00:00Z"], "--from/--to: not aligned on the 3600 s period"),
    (["--from", "2026-03-02T13:00:00Z", "--to", "2026-03-02T13:00:00Z"], "--to: must be after --from"),
    (["--from", "yesterday", "--to", "2026-03-02T13:00:00Z"], "--from"),
])
def test_a_bad_range_is_one_line_naming_the_option_and_exit_2(config, capsys, args, message):
    assert main(["events", "reprocess", "-c", str(config), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_the_replay_on_prism_stores_what_it_stores_on_fnapirunner(tmp_path, prism_endpoint):  # noqa: F811
    """The replay is a plain bounded Beam graph: on Prism (LOOPBACK) it stores FnApiRunner's rows."""
    on_fnapi, on_prism = inbox_workspace(tmp_path / "fnapi"), inbox_workspace(tmp_path / "prism")
    runner = tmp_path / "prism.yaml"
    runner.write_text(json.dumps({"runner": "PortableRunner", "prism": {"endpoint": prism_endpoint},
                                  "environment": {"type": "LOOPBACK"}}))
    assert reprocess(on_fnapi) == 0
    assert reprocess(on_prism, "--runner-config", str(runner)) == 0
    assert table(stored_rows(on_prism), TENANT) == want(WITH_STRAGGLER)
    assert stored_rows(on_prism).equals(stored_rows(on_fnapi))
