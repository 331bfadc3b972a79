"""CloudKitty's own API drives ratebeam through CloudKitty's RPC on a real RabbitMQ (``ratebeam rpc``).

CloudKitty 25.0.0's WSGI app (its venv, ``tests/cloudkitty/ck_api.py``, noauth) shares the rated
demo workspace's database with ratebeam and casts / calls over the test broker; ``ratebeam rpc``
serves the topic.  ``PUT /v2/scope`` (a reset) deletes the scope's rated data from the timestamp
on and moves its state, as ``ratebeam state reset`` does; ``POST /v1/rating/quote`` answers
ratebeam's price (what ``ratebeam rate`` gives for the same usage and rules); ``GET /v2/scope``
reads every state row ratebeam left.  The module notifications are acknowledged.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from pipeline_support import RATEBEAM, ratebeam, stored_rows
from servers.cloudkitty_api import cloudkitty_api, wait_for
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)

from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config

SCOPE = "acme-web"
RESET_TO = datetime(2026, 1, 2, 0, 0, tzinfo=UTC)


@pytest.fixture
def served(copy, rabbitmq_url, tmp_path):  # noqa: F811
    """(CloudKitty API url, ratebeam.yaml): ``ratebeam rpc`` and CloudKitty's API on one broker."""
    rpc_log = tmp_path / "rpc.log"
    with rpc_log.open("w") as out:
        rpc = subprocess.Popen([*RATEBEAM, "-v", "rpc", "-c", str(copy), "--transport-url", rabbitmq_url],
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        with cloudkitty_api(copy.parent / "ratebeam.db", rabbitmq_url, tmp_path) as url:
            wait_for("ratebeam rpc serving", lambda: "serving CloudKitty's RPC" in rpc_log.read_text(), rpc_log, rpc)
            yield url, copy, rpc_log
    finally:
        rpc.terminate()
        rpc.wait(timeout=30)


@pytest.mark.cloudkitty
def test_cloudkittys_api_resets_and_quotes_through_ratebeam(served, tmp_path):
    url, config, rpc_log = served
    loaded = load_config(config, metrics=False)
    store = StateStore(make_engine(loaded.database_url), loaded.scope_key, "source", "file")
    before = stored_rows(config)
    assert before.filter(before["scope_id"] == SCOPE)["begin"].max() > RESET_TO

    scopes = requests.get(f"{url}/v2/scope", timeout=30)
    assert scopes.status_code == 200, scopes.text  # every row ratebeam left is one CloudKitty reads
    assert {s["scope_id"] for s in scopes.json()["results"]} >= {SCOPE, "globex"}

    # python-cloudkittyclient 6.2.0 sends `state`, which this API refuses (400): the API's own key here.
    answer = requests.put(f"{url}/v2/scope", json={"scope_id": SCOPE, "last_processed_timestamp":
                                                   RESET_TO.isoformat()}, timeout=30)
    assert answer.status_code == 202, answer.text
    # The state moves first (under the reset's lease), the delete follows, the lease goes last.
    wait_for("the reset applied", lambda: store.get(SCOPE).last_processed == datetime(2026, 1, 1, 23, tzinfo=UTC)
             and store.holder(SCOPE) is None, rpc_log, timeout=60)
    after = stored_rows(config)
    mine = after.filter(after["scope_id"] == SCOPE)
    assert mine.height > 0 and mine["begin"].max() < RESET_TO  # deleted from the timestamp on, not before
    others = before.filter(before["scope_id"] != SCOPE)
    assert after.filter(after["scope_id"] != SCOPE).equals(others)
    shown = requests.get(f"{url}/v2/scope", params={"scope_id": SCOPE}, timeout=30).json()["results"]
    assert [s["last_processed_timestamp"][:19] for s in shown] == ["2026-01-01T23:00:00"]

    resources = [{"service": "instance", "volume": "2",
                  "desc": {"groupby": {"id": "vm-1"}, "metadata": {"flavor_name": "m1.small", "os_distro": "windows"}}},
                 {"service": "ip.floating", "volume": "3", "desc": {"groupby": {"id": "ip-1"}, "metadata": {}}}]
    quoted = requests.post(f"{url}/v1/rating/quote", json={"resources": resources}, timeout=60)
    assert quoted.status_code == 200, quoted.text
    assert Decimal(str(quoted.json())) == _rated_by_ratebeam(config, resources, tmp_path) > 0

    assert requests.get(f"{url}/v1/rating/reload_modules", timeout=30).status_code == 204
    wait_for("reload_modules acknowledged", lambda: "reload_modules received" in rpc_log.read_text(),
          rpc_log, timeout=30)


def _rated_by_ratebeam(config: Path, resources: list[dict], tmp_path: Path) -> Decimal:
    """The same usage through ``ratebeam rate`` with the workspace's rules (global rules: no scope)."""
    usage = tmp_path / "quote.jsonl"
    usage.write_text("".join(json.dumps({
        "type": r["service"], "qty": r["volume"], "begin": "2026-06-01T00:00:00Z", "end": "2026-06-01T01:00:00Z",
        "groupby": r["desc"]["groupby"], "metadata": r["desc"]["metadata"]}) + "\n" for r in resources))
    done = ratebeam("rate", "--rules", str(config.parent / "rules.json"), "--usage", str(usage))
    assert done.returncode == 0, done.stderr
    (summary,) = [json.loads(line)["summary"] for line in done.stdout.splitlines() if '"summary"' in line]
    assert summary["errors"] == 0
    return Decimal(summary["total"])



@pytest.mark.parametrize(("extra", "message"), [
    ([], "no transport URL: give --transport-url or set $RATEBEAM_TRANSPORT_URL"),
    (["--transport-url", "nosuch://host/"], "--transport-url 'nosuch://host/'"),
])
def test_rpc_without_a_usable_transport_is_refused_clearly(copy, extra, message):
    done = ratebeam("rpc", "-c", str(copy), *extra, env={"RATEBEAM_TRANSPORT_URL": ""})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
