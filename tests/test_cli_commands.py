"""The CLI's structure (one handler per sub-command, Beam loaded only to rate) and ``state reset``'s
data safety: inputs checked before anything is deleted, the state moved before the delete."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys

import pytest
import yaml
from pipeline_support import NOW, counters, leaf_parsers, ratebeam, stored_rows

from ratebeam.pipelines.cli import build_parser

#: Runs the CLI in-process, then prints which heavy modules the command imported.
_PROBE = """
import sys
from ratebeam.pipelines.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
print("IMPORTED", *sorted(m for m in ("apache_beam", "polars") if m in sys.modules))
sys.exit(status)
"""


def _imported(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("IMPORTED"))
    return set(line.split()[1:])


def test_every_sub_command_names_its_handler():
    leaves = list(leaf_parsers(build_parser()))
    # + storage info, serve, state unlock, rpc, report chart|monthly, reprocess create|list|cancel|run,
    # + events serve|reprocess|discrepancies, events failures list|show|clear, config check
    assert len(leaves) == 70
    for leaf in leaves:
        assert callable(leaf.get_default("func")), leaf.prog


def test_help_imports_neither_beam_nor_polars():
    assert _imported("--help") == set()
    assert _imported("state", "reset", "--help") == set()


def test_modules_list_does_not_import_beam(copy):
    assert "apache_beam" not in _imported("modules", "list", "-c", str(copy))


def test_storage_info_prints_each_backends_declared_capabilities(copy, capsys):
    from ratebeam.connectors.storage.delta.backend import DeltaStorage
    from ratebeam.pipelines.cli import main

    before = _fingerprint(copy)
    assert main(["storage", "info", "-c", str(copy)]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[:5] == ["backend", "exact_decimals", "delete", "custom_fields", "rewrite"]
    declared = DeltaStorage.capabilities  # the demo's (the embedded default's) backend
    assert row.split()[:6] == ["0:", "delta", str(declared.exact_decimals), str(declared.supports_delete),
                               str(declared.supports_custom_fields), declared.rewrite]
    assert _fingerprint(copy) == before  # reading capabilities contacts and creates nothing


def _fingerprint(config) -> dict[str, str]:
    """Every file of the workspace (the rated table's files and the SQLite database) by content hash."""
    root = config.parent
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("scope", "begin", "message"),
    [
        ("globex", "0001-01-01T00:00:00Z", "--from: must lie in [1970-01-01T00:00:00+00:00"),
        ("globex", "9999-12-31T23:00:00Z", "--from: must lie in"),
        ("globex", "2026-01-03T00:30:00Z", "--from: not aligned on the 3600 s period"),
        ("globex", "yesterday", "--from: not an ISO-8601 date or time"),
        ("nobody", "2026-01-03T00:00:00Z", "scope 'nobody' has no state yet"),
    ],
)
def test_bad_reset_changes_nothing(copy, scope, begin, message):
    before = _fingerprint(copy)
    done = ratebeam("state", "reset", "-c", str(copy), scope, "--from", begin, "--yes")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert _fingerprint(copy) == before


def test_unreachable_backend_changes_nothing(copy):
    doc = yaml.safe_load(copy.read_text())
    doc["storage"]["backends"].append({"backend": "influxdb", "url": "http://127.0.0.1:9", "retries": 0})
    copy.write_text(yaml.safe_dump(doc))
    before = _fingerprint(copy)
    done = ratebeam("state", "reset", "-c", str(copy), "globex", "--from", "2026-01-03T00:00:00Z", "--yes")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert _fingerprint(copy) == before


def test_crash_between_state_move_and_delete_then_run_gives_the_clean_result(copy):
    clean = stored_rows(copy)
    crashed = ratebeam("state", "reset", "-c", str(copy), "globex", "--from", "2026-01-03T00:00:00Z", "--yes",
                       env={"RATEBEAM_FAILPOINT": "reset:1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert stored_rows(copy).equals(clean)  # nothing deleted yet, but the state moved back
    listing = ratebeam("state", "list", "-c", str(copy))
    assert "2026-01-02T23:00:00+00:00" in listing.stdout
    assert ":reset-" in listing.stdout  # the dead reset still holds globex
    rerun = ratebeam("run", "-c", str(copy), "--now", NOW)  # and its process is gone: taken over at once
    assert rerun.returncode == 0, rerun.stderr
    assert "scope globex: took over the lease of run " in rerun.stderr and ":reset-" in rerun.stderr
    assert "scope globex: no lease to clear" in ratebeam("state", "unlock", "-c", str(copy), "globex").stdout
    assert counters(rerun.stdout)["due"] == counters(rerun.stdout)["committed"] == 24
    assert stored_rows(copy).equals(clean)
    assert counters(ratebeam("run", "-c", str(copy), "--now", NOW).stdout)["due"] == 0


def test_custom_fields_are_refused_where_the_storage_lacks_them(copy):
    done = ratebeam("report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--custom-fields",
                    "SUM(qty) AS qty")
    assert done.returncode == 2, done.stderr
    assert "the delta storage does not support custom fields" in done.stderr
    assert "Traceback" not in done.stderr
