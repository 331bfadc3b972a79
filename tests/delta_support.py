"""What the Delta backend's tests share across stores (a local directory, an S3 bucket)."""

from __future__ import annotations

import threading

from storage_conformance import HOUR, JANUARY, T0, point, rated_table

from ratebeam.connectors.storage.delta.backend import DeltaStorage


def assert_concurrent_writers_all_land(url: str, scopes: int, hours: int, **options) -> None:
    """``scopes`` writers on different scopes, one thread each, ``hours`` writes of 2 types each: every
    point lands (delta-rs retries a commit that lost the race; none is lost or doubled)."""
    DeltaStorage(url, **options).init()
    errors = []

    def run(scope):
        backend = DeltaStorage(url, compact_files=0, **options)
        try:
            for h in range(hours):
                backend.write(rated_table([point(scope, t, T0 + h * HOUR, str(h)) for t in ("a", "b")]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"p{i}",)) for i in range(scopes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert DeltaStorage(url, **options).retrieve(*JANUARY, limit=1000).total == scopes * hours * 2
