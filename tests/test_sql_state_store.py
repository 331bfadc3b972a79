"""The scope state store and its lease, on SQLite and PostgreSQL, with real threads and processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from ratebeam.connectors.sql.lease_owner import make_owner
from ratebeam.connectors.sql.models import Lease, StorageState
from ratebeam.connectors.sql.state_store import StateStore

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 1, 15, 9, 0, tzinfo=UTC)
T2 = datetime(2026, 1, 15, 10, 0, tzinfo=UTC)
HOST = socket.gethostname()
KEY = ("project_id", "keystone", "gnocchi")


@pytest.fixture
def store(engine) -> StateStore:
    return StateStore(engine, *KEY)


def test_make_owner_names_host_pid_start_time_and_run():
    assert re.fullmatch(rf"{re.escape(HOST)}:{os.getpid()}\.\d+\.[0-9a-f]{{12}}:run-1", make_owner("run-1"))
    with pytest.raises(ValueError):
        make_owner("")


@pytest.fixture
def killed_owner():
    """The lease owner made by a process that then died of SIGKILL (and was reaped)."""
    code = "from ratebeam.connectors.sql.lease_owner import make_owner; print(make_owner('killed'), flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    owner = child.stdout.readline().strip()
    yield child, owner
    child.kill()
    child.wait()


def test_a_lease_of_a_process_gone_from_this_host_is_taken_over_at_once(store, killed_owner, caplog):
    """A killed run's leases blocked its scopes until they expired."""
    child, owner = killed_owner
    assert store.acquire("p1", owner, 60, NOW)
    assert store.acquire("p2", f"{owner}@{NOW.isoformat()}", 60, NOW)  # a tick's lease
    assert store.acquire("p1", make_owner("new"), 60, NOW) is None  # alive: waited for
    child.kill()
    child.wait()
    later = NOW + timedelta(seconds=1)
    assert store.acquire("p1", make_owner("new"), 60, later).expires_at == later + timedelta(seconds=60)
    assert store.acquire("p2", make_owner("new"), 60, later)
    assert store.holder("p2").owner == make_owner("new")
    assert f"took over the lease of run {owner}: its process {child.pid} on this host is gone" in caplog.text


def test_only_a_provably_gone_holder_loses_its_lease_early(store, killed_owner):
    """A reused pid (another start time) is no proof of life; another boot or PID namespace, or an
    owner of the old form (no start time), is no proof of death: those are waited for."""
    child, _ = killed_owner
    child.kill()
    child.wait()
    host, process, run = make_owner("alive").split(":")
    pid, start, space = process.split(".")
    reused = f"{host}:{pid}.{int(start) + 1}.{space}:{run}"
    elsewhere = f"{host}:{child.pid}.{start}.{'0' * 12}:{run}"
    legacy = f"{host}:{child.pid}:{run}"
    for scope, owner in [("p1", reused), ("p2", elsewhere), ("p3", legacy), ("p4", make_owner("alive"))]:
        assert store.acquire(scope, owner, 60, NOW)
    assert store.acquire("p1", make_owner("new"), 60, NOW).owner == make_owner("new")
    for scope in ("p2", "p3", "p4"):
        assert store.acquire(scope, make_owner("new"), 60, NOW) is None
    assert store.acquire("p3", make_owner("new"), 60, NOW + timedelta(seconds=60))  # expired: taken


def test_first_acquire_takes_a_lease_and_creates_no_state_row(engine, store):
    """A state row without a timestamp is one CloudKitty cannot read: the lease lives apart."""
    lease = store.acquire("p1", "a", 60, NOW)
    assert lease is not None
    assert (lease.scope, lease.owner, lease.expires_at) == ("p1", "a", NOW + timedelta(seconds=60))
    assert lease.last_processed is None and lease.active
    assert store.get("p1") is None
    holder = store.holder("p1")
    assert (holder.owner, holder.heartbeat_at, holder.expires_at) == ("a", NOW, lease.expires_at)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(StorageState)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(Lease)).scalar_one() == 1


def test_the_first_commit_creates_the_state_row_with_its_timestamp(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.commit("p1", "a", T1)
    state = store.get("p1")
    assert state.last_processed == T1 and state.active and state.lease_owner == "a"
    assert state.lease_expires_at == NOW + timedelta(seconds=60)


def test_a_held_lease_is_exclusive_and_renewable_by_its_owner(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.acquire("p1", "b", 60, NOW + timedelta(seconds=59)) is None
    renewed = store.acquire("p1", "a", 60, NOW + timedelta(seconds=30))
    assert renewed.expires_at == NOW + timedelta(seconds=90)
    assert store.acquire("p1", "b", 60, NOW + timedelta(seconds=89)) is None


def test_an_expired_lease_can_be_taken(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.acquire("p1", "b", 60, NOW + timedelta(seconds=60)).owner == "b"
    assert store.holder("p1").owner == "b"


def test_a_heartbeat_keeps_every_lease_of_its_run_and_only_those(engine, store):
    other = StateStore(engine, "project_id", "keystone", "prometheus")
    assert store.acquire("p1", "a", 60, NOW)
    assert other.acquire("p1", "a", 60, NOW)
    assert store.acquire("p2", "b", 60, NOW)
    assert store.heartbeat("a", 60, NOW + timedelta(seconds=50)) == 2  # both keys
    later = NOW + timedelta(seconds=100)  # past a's first expiry, within its renewed one
    assert store.acquire("p1", "c", 60, later) is None
    assert other.acquire("p1", "c", 60, later) is None
    assert store.acquire("p2", "c", 60, later).owner == "c"  # b never beat: expired, taken
    holder = store.holder("p1")
    assert (holder.heartbeat_at, holder.expires_at) == (NOW + timedelta(seconds=50), NOW + timedelta(seconds=110))


def test_a_dead_holder_is_known_by_its_silent_heartbeat_not_its_pid(store):
    """A lease whose owner names a live PID of this host (a restarted container's PID 1, another
    run of this process) is taken once its heartbeat stops; one still beating is kept."""
    assert store.acquire("p1", make_owner("crashed"), 30, NOW)
    assert store.acquire("p2", make_owner("alive"), 30, NOW)
    assert store.acquire("p1", make_owner("new"), 30, NOW + timedelta(seconds=29)) is None
    store.heartbeat(make_owner("alive"), 30, NOW + timedelta(seconds=20))
    assert store.acquire("p1", make_owner("new"), 30, NOW + timedelta(seconds=30)).owner == make_owner("new")
    assert store.acquire("p2", make_owner("new"), 30, NOW + timedelta(seconds=30)) is None


def test_unlock_clears_a_lease_and_keeps_the_state(store):
    assert store.acquire("p1", "a", 3600, NOW)
    assert store.commit("p1", "a", T1)
    cleared = store.unlock("p1")
    assert (cleared.scope, cleared.owner, cleared.expires_at) == ("p1", "a", NOW + timedelta(hours=1))
    assert store.holder("p1") is None
    assert store.get("p1").last_processed == T1
    assert not store.commit("p1", "a", T2)  # the holder cannot commit after the unlock
    assert store.unlock("p1") is None
    assert store.acquire("p1", "b", 60, NOW).last_processed == T1


def test_state_is_read_after_taking_the_lease(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.commit("p1", "a", T1)
    store.set_active("p1", False, now=NOW)
    assert store.release("p1", "a")
    lease = store.acquire("p1", "b", 60, NOW)
    assert lease.last_processed == T1 and not lease.active


def test_commit_is_fenced_by_the_lease(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.acquire("p1", "b", 60, NOW + timedelta(seconds=61))  # a's lease expired, b took it
    assert not store.commit("p1", "a", T2)
    assert store.get("p1") is None  # nothing written, not even a row
    assert store.commit("p1", "b", T1)
    assert store.get("p1").last_processed == T1
    assert not store.commit("p1", "nobody", T2)


def test_commit_only_moves_forward(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert store.commit("p1", "a", T2)
    assert not store.commit("p1", "a", T1)
    assert store.get("p1").last_processed == T2
    assert store.commit("p1", "a", T2)  # committing the same period again is harmless


def test_release(store):
    assert store.acquire("p1", "a", 60, NOW)
    assert not store.release("p1", "b")
    assert store.acquire("p1", "b", 60, NOW) is None
    assert store.release("p1", "a")
    assert store.holder("p1") is None
    assert store.acquire("p1", "b", 60, NOW).owner == "b"


def test_reset_sets_the_timestamp_and_revokes_the_lease(store):
    store.reset("new", T1, now=NOW)  # creates the row
    assert store.get("new").last_processed == T1
    assert store.acquire("p1", "a", 60, NOW)
    assert store.commit("p1", "a", T2)
    store.reset("p1", T1)
    state = store.get("p1")
    assert state.last_processed == T1 and state.lease_owner is None and store.holder("p1") is None
    assert not store.commit("p1", "a", T2)  # the run that held the lease cannot undo the reset
    assert store.get("p1").last_processed == T1


def test_set_active_moves_the_toggle_date_only_on_change(store):
    store.reset("p1", T1, now=NOW)
    store.set_active("p1", True, now=NOW + timedelta(hours=1))
    assert store.get("p1").activation_toggled_at == NOW
    store.set_active("p1", False, now=NOW + timedelta(hours=2))
    state = store.get("p1")
    assert not state.active and state.activation_toggled_at == NOW + timedelta(hours=2)
    with pytest.raises(KeyError, match="unknown"):
        store.set_active("unknown", False)


def test_list_states_is_per_key_and_filters_on_active(engine, store):
    other = StateStore(engine, "project_id", "keystone", "prometheus")
    for scope in ("b", "a", "c"):
        store.reset(scope, T1, now=NOW)
    other.reset("z", T2, now=NOW)
    store.set_active("b", False, now=NOW)
    assert [s.scope for s in store.list_states()] == ["a", "b", "c"]
    assert [s.scope for s in store.list_states(active=True)] == ["a", "c"]
    assert [s.scope for s in store.list_states(active=False)] == ["b"]
    assert [(s.scope, s.collector, s.last_processed) for s in other.list_states()] == [("z", "prometheus", T2)]


def test_keys_are_independent(engine, store):
    other = StateStore(engine, "project_id", "keystone", "prometheus")
    assert store.acquire("p1", "a", 60, NOW)
    assert other.acquire("p1", "b", 60, NOW)  # same scope, another collector: another state
    assert store.commit("p1", "a", T1)
    assert other.get("p1") is None and other.holder("p1").owner == "b"


def test_a_legacy_row_without_keys_is_adopted(engine, store):
    with engine.begin() as conn:
        conn.execute(sa.insert(StorageState).values(
            identifier="p1", last_processed_timestamp=T1, active=True, scope_activation_toggle_date=NOW))
    lease = store.acquire("p1", "a", 60, NOW)
    assert lease.last_processed is None  # not adopted yet: the legacy row has other keys
    assert store.commit("p1", "a", T2)
    assert store.get("p1").last_processed == T2
    with engine.connect() as conn:
        rows = conn.execute(sa.select(StorageState.scope_key, StorageState.fetcher, StorageState.collector)).all()
    assert rows == [KEY]


def test_timestamps_must_be_aware(store):
    with pytest.raises(ValueError, match="timezone-aware"):
        store.acquire("p1", "a", 60, datetime(2026, 1, 1))  # noqa: DTZ001
    with pytest.raises(ValueError, match="positive"):
        store.acquire("p1", "a", 0, NOW)


def test_threads_racing_for_the_same_scopes_never_share_one(engine, store):
    scopes = [f"scope-{i}" for i in range(15)]
    barrier = threading.Barrier(6)
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def run(owner: str) -> None:
        try:
            barrier.wait()
            won[owner] = [s for s in scopes if store.acquire(s, owner, 60, NOW) is not None]
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(f"thread-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    winners = sorted(s for owned in won.values() for s in owned)
    assert winners == sorted(scopes)  # every scope leased exactly once
    for scope in scopes:
        owner = next(o for o, owned in won.items() if scope in owned)
        assert store.holder(scope).owner == owner


_CHILD = """
import json, sys, time
from datetime import datetime
from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.lease_owner import make_owner
from ratebeam.connectors.sql.state_store import StateStore
url, start_at, now, scopes = sys.argv[1], float(sys.argv[2]), datetime.fromisoformat(sys.argv[3]), sys.argv[4:]
store = StateStore(make_engine(url), "project_id", "keystone", "gnocchi")
owner = make_owner("race")
store.get("warm-up")  # connect before the start line
time.sleep(max(0.0, start_at - time.time()))
won = [s for s in scopes if store.acquire(s, owner, 3600, now) is not None]
print(json.dumps({"owner": owner, "won": won}), flush=True)
sys.stdin.readline()  # alive until every child has raced: a holder that exited is known to be gone
"""


def test_processes_racing_for_the_same_scopes_never_share_one(db_url, engine, store):
    """It once failed under load: a child that had finished its loop and exited (a zombie until
    reaped) was taken for a dead holder by a slower child, which took its leases over, so two
    children reported the same scope.  The children now live until all have raced; once they
    have exited, their leases are taken over at once (their processes are provably gone)."""
    scopes = [f"scope-{i}" for i in range(20)]
    start_at = time.time() + 2.0
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, db_url, str(start_at), NOW.isoformat(), *scopes],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [json.loads(child.stdout.readline() or "null") for child in children]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    winners = sorted(s for result in results for s in result["won"])
    assert winners == sorted(scopes)
    for result in results:
        for scope in result["won"]:
            assert store.holder(scope).owner == result["owner"]
    assert all(store.acquire(s, make_owner("after"), 60, NOW) is not None for s in scopes)
