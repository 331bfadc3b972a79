"""CloudKitty's ``GET /v2/scope`` answers at every moment of ratebeam's first run on a shared database.

A switch from CloudKitty: its database (built by CloudKitty 25.0.0's own migrations,
``tests/cloudkitty/ck_dbsync.py``), ``ratebeam db upgrade`` on it, then a first ``ratebeam run`` of
scopes never rated, while CloudKitty's API (``servers/cloudkitty_api.py``, noauth, ``fake:/``
transport: the endpoint reads the database only) is polled as fast as it answers.  Every row it
reads must be one it can serialize (a row with a NULL timestamp, or a half-written one, answers
500).  Before the first period commits there is no row, and CloudKitty itself answers 404 "No
resource found"; after that, only 200s, each scope's timestamp never moving back.  After the run
the API shows ratebeam's state.  Once on SQLite and once on the tests' PostgreSQL (CloudKitty
through psycopg2 of its overlay, ``cloudkitty_database``).

On PostgreSQL, CloudKitty 25.0.0's ``PUT /v2/scope`` (and ``POST /v2/task/reprocesses``) answer 500
whatever the database holds: its ``StateManager.get_all`` filters the Boolean ``active`` column with
the integer 1 by default (``active IN (1)``), and PostgreSQL has no ``boolean = integer`` operator
(SQLAlchemy 2.0.58 sends the same).  The test pins that, as docs/migrating-from-cloudkitty.md says.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from pipeline_support import NOW, RATEBEAM, counters, setup_database, workspace
from servers import cloudkitty_python
from servers.cloudkitty_api import cloudkitty_api, cloudkitty_database

from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

CK_DBSYNC = Path(__file__).parent / "cloudkitty" / "ck_dbsync.py"
STATE_KEYS = {"scope_id", "scope_key", "fetcher", "collector", "last_processed_timestamp", "active",
              "scope_activation_toggle_date"}


def _cloudkittys_database(db_url: str) -> None:
    """The database CloudKitty's own migrations build (what a deployment switching has)."""
    url, env = cloudkitty_database(db_url)
    done = subprocess.run([cloudkitty_python(), CK_DBSYNC, url], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _timestamps(answer: requests.Response, scope_key: str) -> dict[str, datetime]:
    """{scope: last processed} of a 200 answer, each state checked well-formed."""
    assert answer.status_code == 200, answer.text
    states = answer.json()["results"]
    for state in states:
        assert set(state) == STATE_KEYS, state
        assert (state["scope_key"], state["fetcher"], state["collector"], state["active"]) == (
            scope_key, "source", "file", True), state
    stamps = {s["scope_id"]: datetime.fromisoformat(s["last_processed_timestamp"]) for s in states}
    assert len(stamps) == len(states)  # one row per scope
    return {scope: at if at.tzinfo else at.replace(tzinfo=UTC) for scope, at in stamps.items()}


@pytest.mark.cloudkitty
def test_get_scope_answers_at_every_moment_of_a_first_run(db_url, tmp_path):
    config = workspace(tmp_path / "ws", database_url=db_url)
    _cloudkittys_database(db_url)
    setup_database(config)
    loaded = load_config(config, metrics=False)
    store = StateStore(make_engine(loaded.database_url), loaded.scope_key, "source", "file")
    assert store.list_states() == []  # never rated

    with cloudkitty_api(db_url, "fake:/", tmp_path) as url, requests.Session() as http:
        scopes = f"{url}/v2/scope"
        missing = http.get(scopes, timeout=30)
        assert missing.status_code == 404 and "No resource found" in missing.text
        seen: list[dict[str, datetime]] = []
        with (tmp_path / "run.out").open("w") as out, (tmp_path / "run.err").open("w") as err:
            run = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW], stdout=out, stderr=err)
        try:
            while run.poll() is None:
                answer = http.get(scopes, timeout=30)
                if answer.status_code == 404 and not seen:  # no period committed yet
                    assert "No resource found" in answer.text
                    continue
                seen.append(_timestamps(answer, loaded.scope_key))
        finally:
            run.wait(timeout=300)
        assert run.returncode == 0, (tmp_path / "run.err").read_text()[-3000:]
        final = _timestamps(http.get(scopes, timeout=30), loaded.scope_key)
        if db_url.startswith("postgresql"):
            reset = http.put(scopes, json={"scope_id": "globex", "last_processed_timestamp": NOW}, timeout=30)
            assert reset.status_code == 500
            assert "operator does not exist: boolean = integer" in (tmp_path / "api.log").read_text()

    assert len(seen) >= 3, seen  # polled while the run committed, not only around it
    assert any(stamps != final for stamps in seen)  # some answers came mid-run
    for earlier, later in zip(seen, [*seen[1:], final], strict=True):
        assert set(earlier) <= set(later)
        assert all(later[scope] >= at for scope, at in earlier.items())
    states = store.list_states()
    assert final == {s.scope: s.last_processed for s in states}
    assert len(final) >= 2 and counters((tmp_path / "run.out").read_text())["committed"] > 0
