"""A real dask.distributed cluster on 127.0.0.1 for the Dask runner tests: a scheduler and two workers.

``dask_cluster`` (session fixture) starts ``dask scheduler`` and two ``dask worker --nthreads 1``
as separate OS processes of the test interpreter (so the workers import ratebeam from the same
venv), on free ports, waits until the scheduler knows both workers, and stops them at the end of
the session; ``running(n)`` does the same for a block (a test's private cluster).
``DaskCluster.worker()`` starts one more worker for a block (with its own
environment, e.g. a failpoint that SIGKILLs it mid-run).  The scheduler serves its HTTP endpoints
(the dashboard's port, ``DaskCluster.dashboard``): a real port where something other than the
scheduler's protocol answers.  Without ``distributed`` installed (the
``dask`` extra) the tests skip with the reason, or fail under ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import free_port, stop, unavailable

HOST = "127.0.0.1"
#: Seconds a scheduler or worker has to come up.
START_SECONDS = 60


def _start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})


@dataclass
class DaskCluster:
    """A running scheduler (``address``) and its workers; ``logs`` holds their output."""

    address: str
    logs: Path
    #: ``host:port`` of the scheduler's HTTP server (its dashboard's port).
    dashboard: str

    def runner_config(self, directory: Path, stall_seconds: float | None = None) -> Path:
        """A runner config file naming this cluster's scheduler (and the job's stall limit, when given)."""
        path = directory / "dask-cluster.yaml"
        stall = "" if stall_seconds is None else f", stall_seconds: {stall_seconds:g}"
        path.write_text(f"runner: DaskRunner\ndask: {{scheduler: '{self.address}'{stall}}}\n")
        return path

    def workers(self) -> int:
        """How many workers the scheduler knows now."""
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            return len(client.scheduler_info(n_workers=-1)["workers"])

    def wait_for_workers(self, n: int) -> None:
        """Until the scheduler knows ``n`` workers (fails after ``START_SECONDS``)."""
        deadline = time.monotonic() + START_SECONDS
        while self.workers() != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"the scheduler at {self.address} never had {n} worker(s)")
            time.sleep(0.2)

    def start_worker(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """One more ``dask worker --nthreads 1`` of this cluster (the caller stops it)."""
        return _start(["distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny", "--host", HOST,
                       "--no-dashboard", "--name", name], self.logs / f"{name}.log", env)

    @contextmanager
    def worker(self, name: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
        """``start_worker`` for the block, stopped after it (if it is still alive)."""
        process = self.start_worker(name, env)
        try:
            yield process
        finally:
            stop(process)


class DaskUnavailable(Exception):
    """The cluster could not be started; the message says why."""


@contextmanager
def running(workers: int) -> Iterator[DaskCluster]:
    """A scheduler and ``workers`` single-threaded workers for the block (the scheduler knowing all of them)."""
    logs = Path(tempfile.mkdtemp(prefix="ratebeam-dask-"))
    port, dashboard = free_port(), f"{HOST}:{free_port()}"
    scheduler = _start(["distributed.cli.dask_scheduler", "--host", HOST, "--port", str(port), "--dashboard-address",
                        dashboard], logs / "scheduler.log")
    cluster = DaskCluster(f"tcp://{HOST}:{port}", logs, dashboard)
    started: list[subprocess.Popen] = []
    try:
        started = [cluster.start_worker(f"worker-{n}") for n in range(1, workers + 1)]
        try:
            cluster.wait_for_workers(workers)
        except (AssertionError, OSError) as exc:
            raise DaskUnavailable(f"the Dask cluster did not start ({exc}): "
                                  f"{(logs / 'scheduler.log').read_text()[-1000:]}") from None
        yield cluster
    finally:
        for process in started:
            stop(process)
        stop(scheduler, logs)


@pytest.fixture(scope="session")
def dask_cluster() -> Iterator[DaskCluster]:
    """A scheduler and two single-threaded workers for the session."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        unavailable("dask.distributed is not installed: pip install -e '.[dask]'")
    try:
        with running(2) as cluster:
            yield cluster
    except DaskUnavailable as exc:
        unavailable(str(exc))
