"""What ``ratebeam run`` tells its caller when the cycle is over: a text summary or one JSON object.

The summary is the command's *result*, so it goes to stdout; the log (Beam's, the per-scope lines,
the warnings) stays on stderr.  A scheduler reads ``--json``: one object, whatever happened, with
the figures an alert needs (periods rated, points, failed frames, scopes skipped because another
run holds them, periods the catch-up cap left for the next run) and the warnings about what the
run took but billed nothing of (``factor: 0``, a usage file not read): the run's result, not its log.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from ratebeam.pipelines.commands.common import json_default

if TYPE_CHECKING:
    from ratebeam.connectors.sql.state_store import LeaseHolder
    from ratebeam.pipelines.cycle import CycleReport

#: Failed frames and held leases listed in the text summary; the rest are counted.
MAX_LINES = 20


def summary_of(report: CycleReport, status: int) -> dict[str, Any]:
    """The run as one JSON-ready object (``run --json``); ``status`` is the command's exit status."""
    c = report.counters
    return {
        "run_id": report.run_id,
        "exit_status": status,
        "ok": report.ok,
        "scopes": {"fetched": c.get("scopes_fetched", 0), "rated": c.get("scopes_leased", 0),
                   "up_to_date": c.get("scopes_up_to_date", 0), "inactive": c.get("scopes_skipped_inactive", 0),
                   "skipped_leased_elsewhere": c.get("scopes_skipped_leased_elsewhere", 0),
                   "lease_lost": c.get("scopes_lease_lost", 0)},
        "periods": {"due": c.get("periods_planned", 0), "rated": c.get("periods_committed", 0),
                    "left_by_cap": c.get("periods_left_by_cap", 0)},
        "points": {"collected": c.get("points_collected", 0), "rated": c.get("points_rated", 0),
                   "written": c.get("points_written", 0)},
        "samples_not_finite": c.get("samples_not_finite", 0),
        "failures": [{"scope": f.scope_id, "period": f.begin, "stage": f.stage, "reason": f.reason}
                     for f in report.failures],
        "skipped_leases": [{"scope": h.scope, "owner": h.owner, "expires_at": h.expires_at,
                            "heartbeat_at": h.heartbeat_at} for h in report.held_elsewhere],
        "warnings": report.warnings,
        "files_not_read": [{"path": path, "reason": why} for path, why in report.not_read],
    }


def print_json(report: CycleReport, status: int, out: TextIO) -> None:
    """``summary_of`` as one line of JSON."""
    json.dump(summary_of(report, status), out, default=json_default)
    print(file=out)


def print_csv(report: CycleReport, status: int, out: TextIO) -> None:
    """``summary_of``'s counters as one CSV row (``scopes.fetched``, ``periods.rated``...); the lists are counted."""
    from ratebeam.pipelines.commands.output import write_rows

    row: dict[str, Any] = {}
    for key, value in summary_of(report, status).items():
        if isinstance(value, dict):
            row.update({f"{key}.{inner}": count for inner, count in value.items()})
        else:
            row[key] = len(value) if isinstance(value, list) else value
    write_rows([row], list(row), "csv", out)


def print_text(report: CycleReport, out: TextIO) -> None:
    """The run's counters and, when some frames failed, one line per failed frame."""
    c = report.counters
    print(f"scopes: {c.get('scopes_fetched', 0)} fetched, {c.get('scopes_leased', 0)} rated, "
          f"{c.get('scopes_up_to_date', 0)} up to date, {c.get('scopes_skipped_inactive', 0)} inactive, "
          f"{c.get('scopes_skipped_leased_elsewhere', 0)} busy in another run", file=out)
    print(f"periods: {c.get('periods_planned', 0)} due, {c.get('periods_committed', 0)} committed; "
          f"points: {c.get('points_collected', 0)} collected, {c.get('points_rated', 0)} rated, "
          f"{c.get('points_written', 0)} written", file=out)
    if c.get("samples_not_finite"):
        print(f"samples: {c['samples_not_finite']} NaN/Inf sample(s) dropped (a NaN or infinite sample is no "
              "sample)", file=out)
    requests = f"requests: {c.get('collector_calls', 0)} collector calls"
    if "prometheus_requests" in c:
        requests += f", {c['prometheus_requests']} Prometheus HTTP requests"
    print(requests, file=out)
    for warning in report.warnings:
        print(f"warning: {warning}", file=out)
    if report.not_read:
        print(f"{len(report.not_read)} usage file(s) not read by the collector:", file=out)
        _limited([f"  {path}: {why}" for path, why in report.not_read], out)
    if report.failures:
        print(f"{len(report.failures)} frame(s) failed (run {report.run_id}; all in the dead-letter table, "
              "`ratebeam failures list`):", file=out)
        _limited([f"  scope {f.scope_id} period {f.begin.isoformat()} [{f.stage}] {f.reason}"
                  for f in report.failures], out)
    print_held_leases(report.held_elsewhere, out)
    if c.get("scopes_lease_lost"):
        print(f"{c['scopes_lease_lost']} scope(s) lost their lease before the commit", file=out)


def print_held_leases(held: list[LeaseHolder], out: TextIO) -> None:
    """One line per scope skipped because another run holds it: whose lease, until when."""
    _limited([f"  scope {lease.scope} skipped: run {lease.owner} holds its lease until "
              f"{lease.expires_at.isoformat()} (last heartbeat {lease.heartbeat_at.isoformat()})" for lease in held],
             out)


def _limited(lines: list[str], out: TextIO) -> None:
    for line in lines[:MAX_LINES]:
        print(line, file=out)
    if len(lines) > MAX_LINES:
        print(f"  ... and {len(lines) - MAX_LINES} more", file=out)
