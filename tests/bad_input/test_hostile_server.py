"""Replies of a hostile server (``hostile.HostileServer``) to the storage (``report``) and the collector (``run``).

A storage that answers nonsense must stop ``report`` with one line naming the server and what it
sent, never a traceback or an internal error.  A collector's bad replies fail their frames
(status 1, each reason in the run's summary and the dead-letter table, which records them): the
storage stays as it was.  A Keystone that answers the token request with anything but a token
stops the run (status 2) naming Keystone and what it sent, a redirect included (never followed: the
host it names never sees the credentials); nothing changes.
"""

from __future__ import annotations

import json

import pytest
import yaml

from bad_input.harness import Case, check_refused, cli, snapshot
from bad_input.hostile import HostileServer, Reply

REPLIES = {
    "status-500": (Reply(500, b"oops"), 1, "HTTP 500"),
    "status-503-html": (Reply(503, b"<html>down</html>", {"Content-Type": "text/html"}), 1, "HTTP 503"),
    "status-401": (Reply(401, b"{}"), 2, "authentication refused"),
    "status-403": (Reply(403, b"{}"), 2, "HTTP 403"),
    "redirect-off-host": (Reply(301, b"", {"Location": "http://example.invalid/x"}), 2, "redirect"),
    "redirect-302": (Reply(302, b"", {"Location": "http://example.invalid/y"}), 2, "redirect"),
    "html": (Reply(200, b"<html>hi</html>", {"Content-Type": "text/html"}), 1, "<html>"),
    "broken-json": (Reply(200, b"{not json"), 1, "{not json"),
    "json-list": (Reply(200, b"[1, 2]"), 1, "[1, 2]"),
    "deep-json": (Reply(200, b"[" * 100000 + b"]" * 100000), 1, "JSON"),
    "wrong-shape": (Reply(200, json.dumps({"results": [{"series": [{"values": "x"}]}]}).encode()), 1, "results"),
}
STORAGES = {
    "influxdb": {"backend": "influxdb", "version": 1, "database": "ck", "timeout": 2, "retries": 0},
    "opensearch": {"backend": "opensearch", "index_name": "ck", "timeout": 2},
    "loki": {"backend": "loki", "timeout": 2, "retries": 0},
}


@pytest.fixture(scope="module")
def server():
    with HostileServer() as running:
        yield running


def _point_at(section: str, settings: dict, server: HostileServer, path: str = "/api/v1"):
    def edit(ws):
        document = yaml.safe_load(ws.read_text())
        if section == "storage":
            document["storage"]["backends"] = [{**settings, "url": server.url}]
        else:
            document[section] = {**settings, "url": server.url + path}
        ws.write_text(yaml.safe_dump(document))

    return edit


def _storage_params():
    for storage in STORAGES:
        for reply in REPLIES:
            for command in ("summary", "dataframes"):
                yield pytest.param(storage, reply, command, id=f"{storage}-{reply}-{command}")


@pytest.mark.parametrize(("storage", "reply", "command"), list(_storage_params()))
def test_storage_reply(storage, reply, command, server, workspace_for):
    answer, status, said = REPLIES[reply]
    names = (server.url.split("//")[1], said)
    case = Case(f"{storage}-{reply}", _point_at("storage", STORAGES[storage], server),
                ("report", command, "-c", "{c}"), status=status, names=names)
    server.reply = answer
    check_refused(case, workspace_for(case))


#: Answers to Keystone's token request that keystoneauth cannot read: the run stops naming Keystone and
#: what it sent (it used to stop with ``RecursionError`` or ``TypeError`` as an internal error, or with
#: keystoneauth's "Invalid response from server." that says nothing of the answer).
TOKEN_REPLIES = {
    "null": (Reply(200, b"null"), "no 'token' object in None"),
    "deep-json": (REPLIES["deep-json"][0], "JSON nested too deeply"),
    "html": (REPLIES["html"][0], "not JSON"),
    "broken-json": (REPLIES["broken-json"][0], "{not json"),
    "json-list": (REPLIES["json-list"][0], "no 'token' object in [1, 2]"),
    "no-token": (Reply(200, b'{"tokens": {}}'), "no 'token' object in {'tokens': {}}"),
}
KEYSTONE = {"backend": "keystone", "username": "rating", "password": "secret-pw", "project_name": "service",
            "user_domain_name": "Default", "project_domain_name": "Default", "timeout": 2, "retries": 0}


@pytest.mark.parametrize("reply", TOKEN_REPLIES)
def test_keystone_token_reply(reply, server, workspace_for):
    answer, said = TOKEN_REPLIES[reply]
    names = (server.url.split("//")[1], "the authentication answer is not a Keystone token", said)
    case = Case(f"keystone-{reply}", _point_at("fetcher", KEYSTONE, server, "/v3"),
                ("run", "-c", "{c}", "--now", "2026-01-01T03:00:00Z"), names=names, started=True)
    server.reply = answer
    done = check_refused(case, workspace_for(case))
    assert "secret-pw" not in done.out + done.err


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_keystone_redirect_is_not_followed(status, server, workspace_for):
    """keystoneauth used to follow it: a 307 repeated the POST, password in its body, to the other host."""
    with HostileServer() as other:
        case = Case(f"keystone-redirect-{status}", _point_at("fetcher", KEYSTONE, server, "/v3"),
                    ("run", "-c", "{c}", "--now", "2026-01-01T03:00:00Z"), started=True,
                    names=(server.url.split("//")[1], f"redirected to {other.url}/v3/auth/tokens (HTTP {status})",
                           "redirects are not followed"))
        server.reply = Reply(status, b"", {"Location": f"{other.url}/v3/auth/tokens"})
        done = check_refused(case, workspace_for(case))
        assert other.paths == [], "the credentials were sent to the host the redirect named"
    assert "secret-pw" not in done.out + done.err


COLLECTOR = {"backend": "prometheus", "timeout": 2, "retries": 0}


@pytest.mark.parametrize("reply", ("status-500", "status-401", "redirect-off-host", "html", "broken-json",
                                   "json-list", "wrong-shape", "deep-json"))
def test_collector_reply(reply, server, workspace_for):
    answer, status, said = REPLIES[reply]
    ws = workspace_for(Case(reply, None, ()))
    _point_at("collector", COLLECTOR, server)(ws)
    server.reply = answer
    before = snapshot(ws.parent)
    done = cli("run", "-c", ws, "--now", "2026-01-01T03:00:00Z")
    everything = done.out + done.err
    assert "Traceback" not in everything and "internal error" not in everything, everything
    assert done.status == status, done.err
    assert said in everything, everything  # a fatal stop on stderr; failed frames in the summary (stdout)
    assert {k: v for k, v in snapshot(ws.parent).items() if k.startswith("rated/")} == \
        {k: v for k, v in before.items() if k.startswith("rated/")}, "a failed frame wrote points"
