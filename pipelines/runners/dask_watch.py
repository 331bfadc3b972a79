"""The launcher's side of a Dask job: it watches the job while it waits, and says when it stalled.

Bundles report their progress to the scheduler as they go (``dask_runner._Ledger``); the launcher
looks at it, the tasks running and the workers every :data:`WATCH_SECONDS` (:class:`Watch`), while
the job computes and while the launcher fetches results (:meth:`DaskJob.fetch`: ``Client.gather``
has no bound of its own, and a worker frozen while it holds a result would hang it for good).  A job
that made no progress for its stall limit is cancelled: :class:`DaskJobStalled`, one line, exit 1,
its leases given back by the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any

import dask.bag as db
import dask.distributed as ddist

from ratebeam.pipelines.commands.common import CommandError

LOG = logging.getLogger(__name__)
#: Seconds between two looks of the launcher at its job (progress, running tasks, workers).
WATCH_SECONDS = 2.0
#: Seconds the workers have to tear a finished job's DoFns down.
CLEANUP_SECONDS = 30


class DaskJobStalled(CommandError):
    """The job made no progress for the stall limit: cancelled; one line, exit 1 (the rerun takes it up)."""


@dataclasses.dataclass
class Watch:
    """The launcher's look at its job: progress of the bundles, tasks running, workers; says when it stalled."""

    client: ddist.Client
    job: str
    stall_seconds: float
    #: The Beam labels of each stage's bag (by bag name), for the stall message.
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    _seen: Any = None
    _since: float = dataclasses.field(default_factory=time.monotonic)
    _workers: set[str] | None = None

    def check(self, holders: Iterable[str] = ()) -> None:
        """Raise :class:`DaskJobStalled` when nothing moved for ``stall_seconds``; log workers lost or joined.

        ``holders`` are the workers whose results the launcher is fetching (named when it stalls).
        """
        workers = set(self.client.scheduler_info(n_workers=-1)["workers"])
        if self._workers is not None:
            for gone in sorted(self._workers - workers):
                LOG.warning("Dask worker %s left the cluster: Dask recomputes its tasks on the others", gone)
            for new in sorted(workers - self._workers):
                LOG.info("Dask worker %s joined the cluster", new)
        self._workers = workers
        running = {w: sorted(map(str, keys)) for w, keys in self.client.processing().items() if keys}
        seen = (self.client.get_metadata([self.job, "progress"], default={}), running, sorted(workers))
        now = time.monotonic()
        if seen != self._seen:
            self._seen, self._since = seen, now
            return
        if now - self._since < self.stall_seconds:
            return
        raise DaskJobStalled(f"the Dask job stalled: no progress for {now - self._since:.0f} s (stall_seconds: "
                             f"{self.stall_seconds:g}), {self._running(running, workers, holders)}; cancelled, "
                             "its leases given back: the next run takes the work up")

    def _running(self, running: dict[str, list[str]], workers: set[str], holders: Iterable[str]) -> str:
        if not workers:
            return "no worker in the cluster"
        if not running and holders:
            return f"no task running, fetching results held by {', '.join(sorted(set(holders)))}"
        if not running:
            return f"no task running on its {len(workers)} worker(s)"
        return "; ".join(f"{worker} running {', '.join(sorted({self._label(k) for k in keys}))}"
                         for worker, keys in sorted(running.items()))

    def _label(self, key: str) -> str:
        return next((label for name, label in self.labels.items() if name in key), key.strip("()").split(",")[0])


@dataclasses.dataclass
class DaskJob:
    """One pipeline's computation on the cluster: its name (the key of what its tasks tell the scheduler) and watch."""

    client: ddist.Client
    name: str
    watch: Watch
    #: Run on every worker at the job's end: its DoFns torn down (``dask_runner._release_job``).
    release: Callable[[str], int]

    def wait(self, futures: list[ddist.Future], deadline: float | None = None) -> bool:
        """Until every future is done (True; a task's error raised here) or ``deadline`` (False).

        Looks at the job every ``WATCH_SECONDS`` (:meth:`Watch.check`: a stall raises); on any
        error the futures are cancelled.  Nothing is fetched: the results stay on the workers.
        """
        pending = list(futures)
        try:
            while pending:
                with suppress(TimeoutError):  # a look at the job every WATCH_SECONDS
                    ddist.wait(pending, timeout=WATCH_SECONDS, return_when="FIRST_COMPLETED")
                for future in [f for f in pending if f.done()]:
                    if future.status != "finished":
                        future.result()  # a task's error (or its cancellation), raised without a fetch
                    pending.remove(future)
                if pending:
                    self.watch.check()
                    if deadline is not None and time.monotonic() > deadline:
                        return False
        except BaseException:
            self.client.cancel(futures, force=True)
            raise
        return True

    def checkpoint(self, bags: list[db.Bag]) -> list[list[Any]]:
        """The elements of each bag, computed now (unoptimised, each step once)."""
        futures = self.client.compute(bags, optimize_graph=False)
        self.wait(futures)
        return self.fetch(futures)

    def fetch(self, futures: list[ddist.Future]) -> list[Any]:
        """The results of computed futures, fetched while the job is watched.

        ``Client.gather`` has no bound of its own: a worker frozen while it holds a result (SIGSTOP,
        a hung host) accepts the connection and never answers.  The gather runs in a thread, the
        launcher watching the job meanwhile, so such a worker stalls the job (cancelled, one line
        naming the holders) instead of hanging it; a worker that died is Dask's to recompute.
        """
        fetched: dict[str, Any] = {}

        def gather() -> None:
            try:
                fetched["results"] = self.client.gather(futures)
            except BaseException as exc:  # raised in the launcher's thread below
                fetched["error"] = exc

        thread = threading.Thread(target=gather, name="ratebeam-dask-fetch", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(WATCH_SECONDS)
                if thread.is_alive():
                    holders = self.client.who_has(futures)
                    self.watch.check(worker for workers in holders.values() for worker in workers)
        except BaseException:
            self.client.cancel(futures, force=True)
            raise
        if "error" in fetched:
            raise fetched["error"]
        return fetched["results"]

    def end(self, finished: bool) -> None:
        """Forget what the job told the scheduler, tear its DoFns down on the workers, close the client.

        A job that did not finish (a worker may be frozen) leaves its DoFns to the workers, which
        tear them down once idle.
        """
        try:
            self.client.set_metadata([self.name], None)
            if finished:
                self.client.run(self.release, self.name, on_error="return", callback_timeout=CLEANUP_SECONDS)
        except (OSError, TimeoutError) as exc:  # the cluster went away or hangs: the workers clean up when idle
            LOG.warning("could not clean the Dask job %s up: %s", self.name, exc)
        finally:
            self.client.close()
