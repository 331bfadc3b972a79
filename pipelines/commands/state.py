"""``state list|activate|deactivate|reset``: the scope states, and the one destructive command.

``state reset`` deletes rated data, so it is ordered to never lose any (Hardening, data loss):
every input is checked before anything changes (``--from`` aligned, in the range every backend
stores and not after the scope's next period: a reset forward would skip the periods in between;
the scope known, every backend able to delete and reachable); then the state moves back
*first*, while the reset holds the scope's lease so no run rates a period the delete is about to
remove; only then is storage cleaned.  A crash after the state move leaves at worst stale points
that the re-rating overwrites (writes replace whole (scope, period, type) slices); a failed delete
leaves the state moved back too, so the periods are rated again later all the same.
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ratebeam.failpoints import failpoint
from ratebeam.pipelines.commands.common import CommandError, engine_of, load, parse_instant
from ratebeam.pipelines.commands.output import write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    from ratebeam.connectors.sql.state_store import StateStore
    from ratebeam.pipelines.config import RatebeamConfig

#: ``state reset --from`` range: periods are aligned on the Unix epoch, and InfluxDB counts time in
#: int64 nanoseconds since it (up to 2262-04-11); outside this no backend can hold a rated point.
RESET_MIN = datetime(1970, 1, 1, tzinfo=UTC)
RESET_MAX = datetime(2262, 1, 1, tzinfo=UTC)


def _store(config: RatebeamConfig) -> StateStore:
    from ratebeam.connectors.sql.state_store import StateStore

    return StateStore(engine_of(config), config.scope_key, config.fetcher.backend, config.collector.backend)


def cmd_state_list(args: argparse.Namespace) -> int:
    """Every scope's last processed period and lease."""
    rows = [
        {"scope": s.scope, "last_processed": s.last_processed, "active": s.active,
         "lease_owner": s.lease_owner or "", "lease_expires_at": s.lease_expires_at}
        for s in _store(load(args, metrics=False)).list_states()
    ]
    write_rows(rows, ["scope", "last_processed", "active", "lease_owner", "lease_expires_at"], args.format)
    return EXIT_OK


def cmd_state_unlock(args: argparse.Namespace) -> int:
    """``state unlock SCOPE``: clear the scope's lease, whoever holds it; the state and data stay.

    For a lease whose run is known to be dead and that should not wait for its expiry.  A run
    still working on the scope cannot commit any more; the next run rates its periods again.
    """
    store = _store(load(args, metrics=False))
    if store.get(args.scope) is None:  # a typo, as `state reset NOSUCH`: refused input
        raise CommandError(f"scope {args.scope!r} has no state: no lease to clear", EXIT_BAD_INPUT)
    cleared = store.unlock(args.scope)
    if cleared is None:
        print(f"scope {args.scope}: no lease to clear")
    else:
        print(f"scope {args.scope}: cleared the lease of run {cleared.owner} "
              f"(it would have expired at {cleared.expires_at.isoformat()})")
    return EXIT_OK


def cmd_state_toggle(args: argparse.Namespace) -> int:
    """``state activate|deactivate SCOPE [--create]``; 2 when the scope has no state (and no ``--create``)."""
    try:
        _store(load(args, metrics=False)).set_active(args.scope, args.activate, create=args.create)
    except KeyError:
        raise CommandError(f"scope {args.scope!r} has no state yet (--create makes it)", EXIT_BAD_INPUT) from None
    print(f"scope {args.scope}: {'activated' if args.activate else 'deactivated'}")
    return EXIT_OK


def cmd_state_reset(args: argparse.Namespace) -> int:
    """``state reset SCOPE --from BEGIN --yes``: without ``--yes`` (as ``failures clear``), say what it would do."""
    config = load(args, metrics=False)
    begin = parse_instant(args.begin, "--from")
    return reset_scope(config, _store(config), args.scope, begin, create=args.create, confirmed=args.yes)


def reset_scope(config: RatebeamConfig, store: StateStore, scope: str, begin: datetime, *,
                create: bool = False, confirmed: bool = True) -> int:
    """Delete the scope's rated data from ``begin`` on and make ``begin`` the next period rated.

    Unlike CloudKitty (`cloudkitty/orchestrator.py:221-246`) the period at ``begin`` is re-rated: state is set to the period
    before it.  The order (checks, state move under a lease, delete, release) is the module's.
    An unknown scope is refused (a typo must not create one) unless ``create`` is True.  Without
    ``confirmed`` (``--yes``), every check is made and the deletion said, not done (exit 2).
    """
    from ratebeam.connectors.errors import ConnectorError
    from ratebeam.connectors.registry import make_backend
    from ratebeam.connectors.sql.lease_owner import make_owner

    last = reset_state_of(begin, config.period)
    state = store.get(scope)
    created = state is None
    if created and not create:
        raise CommandError(f"scope {scope!r} has no state yet: nothing to reset (--create makes it)",
                           EXIT_BAD_INPUT)
    if state is not None and state.last_processed is not None and last > state.last_processed:
        following = state.last_processed + timedelta(seconds=config.period)
        raise InputError("command line", "--from",
                         f"after {following.isoformat()}, the next period scope {scope} rates: a reset moves "
                         "a scope back, never forward (the periods in between would never be rated)",
                         begin.isoformat())
    backends = [make_backend(storage, config.scope_key) for storage in config.storage]
    unable = [b.capabilities.name for b in backends if not b.capabilities.supports_delete]
    if unable:
        raise CommandError(f"state reset: the {', '.join(unable)} storage cannot delete rated data; "
                           "nothing was changed", EXIT_BAD_INPUT)
    if not confirmed and not created:
        raise CommandError(f"would delete the rated data of scope {scope} from {begin.isoformat()} on and rate it "
                           "again; nothing was changed: add --yes to do it", EXIT_BAD_INPUT)
    opened = []
    try:
        for backend in backends:
            backend.init()
            opened.append(backend)
        owner = make_owner(f"reset-{uuid.uuid4().hex[:12]}")
        store.reset(scope, last, owner=owner, ttl_s=config.lease_seconds)
        try:
            failpoint("reset")
            for backend in backends:
                try:
                    backend.delete(begin=begin, end=None, filters={"scope_id": scope})
                except ConnectorError as exc:
                    raise CommandError(
                        f"scope {scope}: state moved back to {last.isoformat()}, but deleting from the "
                        f"{backend.capabilities.name} storage failed ({exc}); the next run rates "
                        f"from {begin.isoformat()} again and overwrites what is left"
                    ) from exc
        finally:
            store.release(scope, owner)
    finally:
        for backend in opened:
            backend.close()
    done = "created" if created else f"rated data from {begin.isoformat()} deleted"
    print(f"scope {scope}: {done}; next run rates from {begin.isoformat()}")
    return EXIT_OK


def reset_state_of(begin: datetime, period: int) -> datetime:
    """The state a reset to ``begin`` stores (the period before it), or the ``InputError`` why not."""
    if not RESET_MIN <= begin < RESET_MAX:
        raise InputError("command line", "--from",
                         f"must lie in [{RESET_MIN.isoformat()}, {RESET_MAX.isoformat()})", begin.isoformat())
    if begin.timestamp() % period:
        raise InputError("command line", "--from", f"not aligned on the {period} s period", begin.isoformat())
    return begin - timedelta(seconds=period)
