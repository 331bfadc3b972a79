"""One Python SDK worker process of ratebeam's EXTERNAL worker pool, its metric short ids its own.

Beam's ``worker_pool_main`` starts each worker as ``python -c "...SdkHarness(...).run()"``.  A
worker names each metric it reports by a *short id* that it numbers from 1
(``apache_beam.runners.worker.sdk_worker.SHORT_ID_CACHE``), and Prism (2.75 and 2.78) keys the short ids of
all the workers of one job together: with two worker processes the second one's "1" is read as the
first one's, so its counters are lost or misread (or Prism panics "error decoding metrics").  This
entry point starts the counter of the process at a random 62-bit offset, so the short ids of the
workers of a job never meet, and then starts the harness the pool asked for; the process ends
when the pool does (``tethered.exit_with_parent``; the wrapper passes the pool's pid in
``RATEBEAM_POOL_PID``), even when the pool was killed.
``runners.worker_pool`` makes it the ``python`` its pool starts.

The pool's ``-c`` command is never executed: it is matched against the one command Beam's pool
writes, and its four values (control endpoint, worker id, state cache size, data buffer time
limit) are passed to ``SdkHarness`` directly.  Anything else is refused.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from dataclasses import dataclass

from ratebeam.pipelines.runners.gc_thresholds import apply_gc_thresholds
from ratebeam.pipelines.runners.tethered import exit_with_parent

#: Bits of the random start of a process's short ids: two workers' ids meet with odds ~ ids / 2**62.
OFFSET_BITS = 62

#: The command of ``apache_beam.runners.worker.worker_pool_main`` (``use_process=True``), exactly.
_POOL_COMMAND = re.compile(
    r'from apache_beam\.runners\.worker\.sdk_worker import SdkHarness; '
    r'SdkHarness\("(?P<control>[^"\\]+)",worker_id="(?P<worker_id>[^"\\]*)",'
    r'state_cache_size=(?P<cache>-?\d+),data_buffer_time_limit_ms=(?P<buffer>-?\d+)\)\.run\(\)')

#: The pool's pid, set by the wrapper that starts this module (``runners.worker_pool``).
POOL_PID = "RATEBEAM_POOL_PID"

USAGE = "usage: python -m ratebeam.pipelines.runners.sdk_worker -c \"<the SdkHarness command of Beam's worker pool>\""


@dataclass(frozen=True)
class HarnessRequest:
    """What Beam's pool asks of a worker process: the values of its ``SdkHarness(...)`` call."""

    control_endpoint: str
    worker_id: str
    state_cache_size: int
    data_buffer_time_limit_ms: int


def parse_pool_command(code: str) -> HarnessRequest | None:
    """The harness ``code`` (the pool's ``-c`` text) starts, or None when it is not the pool's command."""
    found = _POOL_COMMAND.fullmatch(code.strip())
    if found is None:
        return None
    return HarnessRequest(found["control"], found["worker_id"], int(found["cache"]), int(found["buffer"]))


def own_short_ids() -> int:
    """Start this process's metric short ids at a random offset (Beam has no option for it); returns it."""
    from apache_beam.runners.worker import sdk_worker

    offset = secrets.randbits(OFFSET_BITS)
    sdk_worker.SHORT_ID_CACHE._last_short_id = offset
    return offset


def main(argv: list[str] | None = None) -> None:
    """Run the worker the pool's ``-c`` command describes, with this process's own short ids."""
    exit_with_parent(int(os.environ.get(POOL_PID, os.getppid())))  # before Beam's imports: they take seconds
    from apache_beam.runners.worker.sdk_worker import SdkHarness

    from ratebeam.pipelines.runners.state_sampler import skip_sampling_thread

    args = sys.argv[1:] if argv is None else argv
    request = parse_pool_command(args[1]) if len(args) == 2 and args[0] == "-c" else None
    if request is None:
        raise SystemExit(f"{USAGE} (got {' '.join(args)[:200]!r})")
    own_short_ids()
    apply_gc_thresholds()  # the steps' live heaps (runners.gc_thresholds)
    skip_sampling_thread()  # no join at every bundle's end (runners.state_sampler)
    SdkHarness(request.control_endpoint, worker_id=request.worker_id, state_cache_size=request.state_cache_size,
               data_buffer_time_limit_ms=request.data_buffer_time_limit_ms).run()


if __name__ == "__main__":
    main()
