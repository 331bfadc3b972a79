"""One Python SDK worker process of ratebeam's EXTERNAL worker pool, its metric short ids its own.

Beam's ``worker_pool_main`` starts each worker as ``python -c "...SdkHarness(...).run()"``.  A
worker names each metric it reports by a *short id* that it numbers from 1
(``apache_beam.runners.worker.sdk_worker.SHORT_ID_CACHE``), and Prism 2.75 keys the short ids of
all the workers of one job together: with two worker processes the second one's "1" is read as the
first one's, so its counters are lost or misread (or Prism panics "error decoding metrics").  This
entry point starts the counter of the process at a random 62-bit offset, so the short ids of the
workers of a job never meet, and then runs the pool's command as ``python -c`` would.
``runners.worker_pool`` makes it the ``python`` its pool starts.
"""

from __future__ import annotations

import secrets
import sys

#: Bits of the random start of a process's short ids: two workers' ids meet with odds ~ ids / 2**62.
OFFSET_BITS = 62


def main(argv: list[str] | None = None) -> None:
    """Run ``-c CODE [ARG...]`` (the pool's worker command) with this process's own short ids."""
    from apache_beam.runners.worker import sdk_worker

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "-c":
        raise SystemExit(f"usage: python -m ratebeam.pipelines.sdk_worker -c CODE [ARG...] (got {args[:1]})")
    sdk_worker.SHORT_ID_CACHE._last_short_id = secrets.randbits(OFFSET_BITS)  # Beam has no option for it
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<sdk worker>", "exec"), {"__name__": "__main__"})  # noqa: S102  (as `python -c`)


if __name__ == "__main__":
    main()
