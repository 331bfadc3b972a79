"""Beam's per-bundle sampling thread, left out of the worker processes of ratebeam's pool.

The Python SDK gives every bundle a ``StateSampler`` that starts a thread to sample which step is
running (for Beam's per-step ``…-msecs`` execution-time counters), and whose ``stop`` joins it at
the end of the bundle.  That thread sleeps up to 200 ms between samples and needs the GIL to end
(``apache_beam/runners/worker/statesampler_fast.pyx``, ``stop``: "May have to wait up to
sampling_period_ms"), so every bundle ends with a wait::

    bundle:  process elements ── outputs sent (is_last) ── stop(): join the sampler ── response
    Prism 2.78:                    └─ select loop on the closed data channel: spins a core ─┘

Measured in the event stream (``bench/bench_events.py``, 10,000 instances, one tenant,
``runner_configs/prism-events.yaml``): the join took 25-60 ms of every 70-160 ms bundle of the
source and of the scope step, the source's polls (the critical path) waited for it, and Prism
(``internal/stage.go``, ``Execute``: its progress loop keeps selecting the data channel it already
saw closed) burned a core meanwhile: 80% of Prism's CPU.  Without the thread the join is gone:
with the graph's fix for the writing stage (``events.graph._LastStageOutput``), Prism's CPU in a
drain fell from 2.5-2.8 s to 1.1-1.3 s and the stream drained 4,200-4,400 notifications/s where it
had drained 3,700-3,800, alternating in one session (docs/performance.md, fifth round).

What is given up: Beam's execution-time counters read 0, and the SDK's lull warnings (asked for
only through a runner's worker-status endpoint, which Prism does not serve) have no time to go
by.  ratebeam reads neither: the streaming job's liveness is its own ``source_polls`` counter
(``pipelines.ops.watchdog``).  The sampler is still the thread's current tracker, so the SDK's
log records keep naming their step.
"""

from __future__ import annotations

import threading

from apache_beam.runners.worker import statesampler

#: Beam's sampler, as imported (what :func:`skip_sampling_thread` replaces).
BEAM_STATE_SAMPLER = statesampler.StateSampler


class ThreadlessStateSampler(BEAM_STATE_SAMPLER):  # type: ignore[misc,valid-type]  # Beam's class is untyped
    """Beam's ``StateSampler`` that tracks the current step but starts no sampling thread to join."""

    def start(self) -> None:
        """Track the bundle's steps from this thread (the state transitions still count)."""
        self.tracked_thread = threading.current_thread()
        statesampler.set_current_tracker(self)
        self.started = True

    def stop(self) -> None:
        """End the bundle's tracking: nothing to join."""
        statesampler.set_current_tracker(None)
        self.finished = True


def skip_sampling_thread() -> None:
    """Make every bundle processor of this process created from now on use :class:`ThreadlessStateSampler`.

    ``BundleProcessor`` looks ``statesampler.StateSampler`` up when it is created (one per bundle
    descriptor of a worker), so this is called before the process runs a bundle: in each worker of
    ratebeam's pool (``runners.sdk_worker``).  Not in a process that runs its steps itself
    (FnApiRunner, LOOPBACK): there a CI rehearsal twice saw ``serve`` in the image (LOOPBACK) end a
    job without committing its first tick, a failure not reproduced alone and not explained, so
    those processes keep Beam's sampler until it is.
    """
    statesampler.StateSampler = ThreadlessStateSampler
