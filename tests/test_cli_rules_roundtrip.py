"""Whatever the per-rule commands store, ``rules export`` writes and ``rules import`` takes back unchanged.

The per-rule commands (``hashmap mapping|threshold create|update|delete``) and ``rules import``
check the same uniqueness rules (``transforms.hashmap_constraints``, CloudKitty's own): random rule
sets built one rule at a time — refusals included, they must simply leave the rules as they were —
export, import and export again to the same document.  The CLI runs in-process on SQLite for
speed; one case runs the real ``ratebeam`` processes, and one builds its rules through CloudKitty
25.0.0's own API (its start-up takes seconds: a fixed case, not a property).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_support import ratebeam, workspace

from ratebeam.pipelines.cli import main

INSTANTS = [None, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"]
TENANTS = [None, "t1", "t2"]
GROUPS = [None, "g1", "g2"]
LEVELS = ["0", "5", "5.0", "10"]
COSTS = ["0.1", "0.2", "1", "2.5"]


class Cli:
    """The CLI in-process on one workspace: ``call`` gives (status, stdout), ``json`` parses stdout."""

    def __init__(self, config: Path, capsys) -> None:
        self.config, self.capsys = config, capsys

    def call(self, *args: str) -> tuple[int, str]:
        self.capsys.readouterr()
        try:
            status = main([*args, "-c", str(self.config)])
        except SystemExit as exit:
            status = exit.code
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err and "internal error" not in err, err
        return status, out

    def json(self, *args: str):
        status, out = self.call(*args, "-f", "json")
        return json.loads(out) if status == 0 else None


def _optional(flag: str, value: str | None) -> list[str]:
    return [] if value is None else [flag, value]


mapping_create = st.fixed_dictionaries({
    "op": st.just("mapping"), "field": st.booleans(), "value": st.sampled_from(["a", "b"]),
    "tenant": st.sampled_from(TENANTS), "group": st.sampled_from(GROUPS), "start": st.sampled_from(INSTANTS),
    "end": st.sampled_from(INSTANTS), "cost": st.sampled_from(COSTS), "type": st.sampled_from(["flat", "rate"])})
threshold_create = st.fixed_dictionaries({
    "op": st.just("threshold"), "field": st.booleans(), "level": st.sampled_from(LEVELS),
    "tenant": st.sampled_from(TENANTS), "group": st.sampled_from(GROUPS), "cost": st.sampled_from(COSTS)})
change = st.fixed_dictionaries({
    "op": st.just("update"), "which": st.integers(0, 20), "tenant": st.sampled_from(TENANTS),
    "end": st.sampled_from(INSTANTS), "level": st.sampled_from(LEVELS)})
delete = st.fixed_dictionaries({"op": st.just("delete"), "which": st.integers(0, 20)})
OPERATIONS = st.lists(st.one_of(mapping_create, threshold_create, change, delete), min_size=1, max_size=14)


def _apply(cli: Cli, tree: dict[str, str], made: list[tuple[str, str]], op: dict) -> None:
    """One operation through the per-rule commands; a refusal (exit 2) is fine, anything else is not."""
    if op["op"] in ("mapping", "threshold"):
        parent = ["--field-id", tree["field"]] if op["field"] else ["-s", tree["service"]]
        args = ["hashmap", op["op"], "create", *parent, "--cost", op["cost"], *_optional("-g", op["group"]),
                *_optional("-p", op["tenant"])]
        if op["op"] == "mapping":
            args += [*(["--value", op["value"]] if op["field"] else []), "-t", op["type"],
                     *_optional("--start", op["start"]), *_optional("--end", op["end"])]
        else:
            args += ["--level", op["level"]]
        status, out = cli.call(*args, "-f", "json")
        assert status in (0, 2), out
        if status == 0:
            made.append((op["op"], json.loads(out)[f"{op['op']}_id"]))
        return
    if not made:
        return
    kind, ref = made[op["which"] % len(made)]
    if op["op"] == "delete":
        status, _ = cli.call("hashmap", kind, "delete", ref)
        assert status in (0, 2)
        return
    changes = ["--level", op["level"]] if kind == "threshold" else [*_optional("--end", op["end"]), "--force"]
    status, _ = cli.call("hashmap", kind, "update", ref, *changes, *_optional("-p", op["tenant"]))
    assert status in (0, 2)


def _round_trip(cli: Cli, folder: Path) -> None:
    """export, import, export: the same document, the import accepted."""
    backup = folder / f"backup-{uuid.uuid4().hex[:6]}.json"
    assert cli.call("rules", "export", str(backup))[0] == 0
    status, out = cli.call("rules", "import", str(backup))
    assert status == 0, (out, backup.read_text())
    status, again = cli.call("rules", "export")
    assert status == 0
    assert json.loads(again) == json.loads(backup.read_text())


@pytest.fixture
def fresh(tmp_path_factory, capsys):
    """``fresh()``: a new migrated SQLite workspace with a service, a field and two groups (one per example)."""
    def make() -> tuple[Cli, dict[str, str], Path]:
        folder = tmp_path_factory.mktemp("rules")
        cli = Cli(workspace(folder / "ws"), capsys)
        assert cli.call("db", "upgrade")[0] == 0
        service = cli.json("hashmap", "service", "create", "volume.size")["service_id"]
        field = cli.json("hashmap", "field", "create", "volume.size", "volume_type")["field_id"]
        for group in ("g1", "g2"):
            assert cli.call("hashmap", "group", "create", group)[0] == 0
        return cli, {"service": service, "field": field}, folder

    return make


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_rules_built_one_at_a_time_always_export_and_import_back(fresh, operations):
    cli, tree, folder = fresh()
    made: list[tuple[str, str]] = []
    for op in operations:
        _apply(cli, tree, made, op)
    _round_trip(cli, folder)


def test_the_reported_backup_that_could_not_be_restored(tmp_path):
    """Two global thresholds at one level (CloudKitty's unique constraint lets NULL tenants repeat),
    through the real ``ratebeam`` processes: the backup restores."""
    config = workspace(tmp_path / "ws")
    c = ["-c", str(config)]
    for args in (["db", "upgrade"], ["hashmap", "service", "create", "volume.size"],
                 ["hashmap", "threshold", "create", "-s", "volume.size", "--level", "5", "--cost", "0.1"],
                 ["hashmap", "threshold", "create", "-s", "volume.size", "--level", "5", "--cost", "0.2"]):
        done = ratebeam(*args, *c)
        assert done.returncode == 0, done.stderr
    exported = ratebeam("rules", "export", *c)
    assert exported.returncode == 0, exported.stderr
    (tmp_path / "b.json").write_text(exported.stdout)
    restored = ratebeam("rules", "import", str(tmp_path / "b.json"), *c)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(ratebeam("rules", "export", *c).stdout) == json.loads(exported.stdout)
    # a tenant's thresholds keep CloudKitty's unique constraint, in both ways of storing them
    tenant = ["hashmap", "threshold", "create", "-s", "volume.size", "--level", "5", "-p", "t1", "--cost"]
    assert ratebeam(*tenant, "0.3", *c).returncode == 0
    twice = ratebeam(*tenant, "0.4", *c)
    assert twice.returncode == 2 and "--level" in twice.stderr


@pytest.mark.cloudkitty
def test_rules_made_through_cloudkittys_api_export_and_import_back(tmp_path):
    """The database CloudKitty's own migrations built (``ck_dbsync.py``), then ``ratebeam db upgrade``."""
    import subprocess

    from servers import cloudkitty_python
    from servers.cloudkitty_api import cloudkitty_api

    database = tmp_path / "ck.db"
    config = workspace(tmp_path / "ws", database_url=f"sqlite:///{database}")
    c = ["-c", str(config)]
    synced = subprocess.run([cloudkitty_python(), Path(__file__).parent / "cloudkitty" / "ck_dbsync.py",
                             f"sqlite:///{database}"], capture_output=True, text=True, timeout=300, check=False)
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert ratebeam("db", "upgrade", *c).returncode == 0
    hashmap = "/v1/rating/module_config/hashmap"
    with cloudkitty_api(database, "fake:/", tmp_path) as url, requests.Session() as http:
        def post(path: str, body: dict) -> dict:
            answer = http.post(f"{url}{hashmap}/{path}", json=body, timeout=60)
            assert answer.status_code in (200, 201), answer.text
            return answer.json()

        service = post("services", {"name": "volume.size"})["service_id"]
        field = post("fields", {"service_id": service, "name": "volume_type"})["field_id"]
        group = post("groups", {"name": "g1"})["group_id"]
        for level, cost in ((5, 0.1), (5, 0.2)):  # global thresholds repeating a level
            post("thresholds", {"service_id": service, "level": level, "cost": cost, "type": "flat"})
        post("thresholds", {"field_id": field, "level": 1, "cost": 1, "tenant_id": "t1", "group_id": group})
        # CloudKitty's asymmetric duplicate check lets a later open-ended mapping start inside an earlier window
        post("mappings", {"field_id": field, "value": "ssd", "cost": 1, "start": "2030-01-01T00:00:00",
                          "end": "2030-06-01T00:00:00"})
        post("mappings", {"field_id": field, "value": "ssd", "cost": 2, "start": "2030-02-01T00:00:00"})
        post("mappings", {"service_id": service, "cost": 0.5, "tenant_id": "t2", "start": "2030-01-01T00:00:00"})
    exported = ratebeam("rules", "export", *c)
    assert exported.returncode == 0, exported.stderr
    assert len(json.loads(exported.stdout)["services"][0]["thresholds"]) == 2
    (tmp_path / "b.json").write_text(exported.stdout)
    restored = ratebeam("rules", "import", str(tmp_path / "b.json"), *c)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(ratebeam("rules", "export", *c).stdout) == json.loads(exported.stdout)
