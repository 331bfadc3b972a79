"""The cyclic garbage collector's thresholds in the processes that run ratebeam's steps.

The event stream allocates a few container objects per notification while the scopes' views hold
every open instance's events: with Python's defaults (700, 10, 10) the collector scans that live
heap again and again.  At 10,000 instances these thresholds drained 1,900-2,100 notifications/s
where the defaults gave 1,550-1,690 (one tenant; ten tenants 1,400-1,680 against 1,220), same
peak RSS (``bench/bench_events.py``).  They are set where the steps run: in ``events serve``'s
process (its SDK worker too, with a LOOPBACK environment) and in every worker process of
ratebeam's EXTERNAL worker pool (``runners.sdk_worker``), which cannot tell which job's steps it
will run (until 2026-12-07 the pool's workers kept the defaults, among them the scope step's worker
of ``runner_configs/prism-events.yaml``).
"""

from __future__ import annotations

import gc

#: (generation 0, 1, 2) thresholds: a young collection every 50,000 net allocations instead of 700.
GC_THRESHOLDS = (50_000, 20, 100)


def apply_gc_thresholds() -> None:
    """Set :data:`GC_THRESHOLDS` for this process."""
    gc.set_threshold(*GC_THRESHOLDS)
