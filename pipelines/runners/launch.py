"""Starting what a runner config needs around one pipeline run, and stopping it afterwards.

``launched(config)`` turns a ``RunnerConfig`` into the Beam options of one run: it starts Prism
(``prism --job_port <free> --serve_http=false``) when the file asks for it, a local pool of Python
SDK workers (``apache_beam.runners.worker.worker_pool_main``) for an ``EXTERNAL`` environment
without an endpoint, and checks beforehand what Beam would only find out with a traceback (a job
server that does not answer, a Prism or a Flink job server jar that is not there).  Such a runner
gives one ``RunnerUnavailable`` line and exit status 2.  ``prism: {binary: auto}`` finds Prism as
Beam does (``_prism_binary``): on PATH, in the image, or Beam's release binary in Beam's cache.

Prism starts one SDK worker process per SDK environment of the pipeline: one for a cycle, one
more per stage given its own ``resource_hints`` in the runner config.  Prism (2.75, and 2.78 still:
one ``metricsStore`` per job) keys the metric short ids of all SDK workers of a job together, while
each Python worker numbers its own from 1:
with two processes one's counters were lost or misread (or Prism panicked "error decoding
metrics").  The pool started here therefore runs each worker through ``pipelines.runners.sdk_worker``,
which numbers the process's short ids from a random offset.  A pool started by hand for Prism
needs the same (``python`` on its PATH being ``python -m ratebeam.pipelines.runners.sdk_worker``); Flink
runs ``--sdk_worker_parallelism`` workers and is not known to need it.

A ``DaskRunner`` runs on the dask.distributed scheduler its ``dask`` section names (checked first
to complete Dask's handshake within ``connect_timeout``: anything else listening there is named,
exit 2), or on a local cluster started here (:func:`dask_cluster`: a ``dask scheduler`` and
``workers`` ``dask worker`` processes of this interpreter, so they import ratebeam), through
ratebeam's translation of Beam's DaskRunner (``pipelines.runners.dask_runner``).  Without the ``dask``
extra installed it is refused in one line naming it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions, PortableOptions

from ratebeam.connectors.extras import require_extra
from ratebeam.pipelines.commands.common import CommandError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT
from ratebeam.pipelines.runners.config import DaskSettings, RunnerConfig
from ratebeam.pipelines.runners.sdk_worker import POOL_PID
from ratebeam.pipelines.runners.tethered import dies_with_parent

#: Seconds a started job server or worker pool has to listen on its port.
START_SECONDS = 30
#: ratebeam's translation of Beam's DaskRunner (``--runner`` takes a class path).
DASK_RUNNER = "ratebeam.pipelines.runners.dask_runner.DaskRunner"
#: The Prism ratebeam runs, newer than the apache-beam SDK it is pinned to (2.75.0): the Job and Fn APIs
#: are Beam's portable protocol, and Prism 2.78 fixes two faults of 2.75 that the event stream met.
#: 2.75's scheduler loop ran again at once while a stateful key had elements waiting on its running
#: bundle (``engine/elementmanager.go``, ``buildEventTimeBundle``): one core spun through a drain
#: (measured, 10,000 instances: Prism's CPU 9.0 s → 2.1 s, 16.7 s → 3.3 s with ten tenants).  And 2.75's
#: ``splitBundle`` released a key the primary still held (``events.serve.NO_DYNAMIC_SPLITS``).
#: ``tests/servers/prism_install.sh`` and the Dockerfile build this version; a test checks they agree.
PRISM_VERSION = "2.78.0"
#: How Prism is installed at :data:`PRISM_VERSION`.
PRISM_INSTALL = f"go install github.com/apache/beam/sdks/v2/go/cmd/prism@v{PRISM_VERSION}"
#: Where ratebeam's container image (or an operator) puts a Prism that is not on PATH.
PRISM_ENV = "RATEBEAM_PRISM_BINARY"
#: Seconds without a byte before Beam's download of the Prism release binary is given up.
DOWNLOAD_SECONDS = 60

_LOG = logging.getLogger(__name__)


class RunnerUnavailable(CommandError):
    """The configured runner cannot start: one line, exit status 2 (nothing was rated)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_BAD_INPUT)


@dataclass(frozen=True)
class Launch:
    """What ``run_cycle`` needs: the runner, its options and the stages' resource hints."""

    runner: str
    options: list[str]
    resource_hints: dict[str, dict[str, str]] = field(default_factory=dict)


@contextmanager
def launched(config: RunnerConfig) -> Iterator[Launch]:
    """The options of one run on ``config``'s runner, with what it needs running until the block ends."""
    with ExitStack() as stack:
        if config.runner == "DaskRunner":
            options = [*config.options, *_dask_options(config.dask or DaskSettings(), stack)]
            yield Launch(DASK_RUNNER, options)
            return
        options = list(config.options)
        given = PipelineOptions(options).view_as(PortableOptions).job_endpoint
        if config.prism is not None:
            binary = config.prism.start_binary
            endpoint = config.prism.endpoint or stack.enter_context(prism_job_server(_prism_binary(binary)))
            options.append(f"--job_endpoint={endpoint}")
            _listening(endpoint, "the Prism job server")
        elif given:
            _listening(given, "the job server (--job_endpoint)")
        elif config.runner == "FlinkRunner":
            _check_flink_job_server(options)
        endpoint = PipelineOptions(options).view_as(PortableOptions).job_endpoint
        if config.runner_options and endpoint:
            _check_runner_options(endpoint, config.runner_options)
        options += config.runner_options
        if config.environment is not None:
            if config.environment.type == "LOOPBACK":
                options.append("--environment_type=LOOPBACK")
            else:
                # An endpoint is where the runner's workers (e.g. each TaskManager) reach their pool,
                # not necessarily reachable from here: it is not checked.
                pool = config.environment.endpoint or stack.enter_context(worker_pool())
                options += ["--environment_type=EXTERNAL", f"--environment_config={pool}"]
        yield Launch(config.runner, options, dict(config.resource_hints))


def _dask_options(settings: DaskSettings, stack: ExitStack) -> list[str]:
    """The Dask runner's options: its scheduler (answering, or a local cluster started on ``stack``)."""
    require_extra("dask", "runner: DaskRunner")
    require_extra("dask", "runner: DaskRunner", "apache_beam.runners.dask.dask_runner")  # registers --dask_* options
    require_extra("dask", "runner: DaskRunner", "ratebeam.pipelines.runners.dask_runner")  # and ratebeam's own
    from ratebeam.pipelines.runners.dask_handshake import handshake

    npartitions = settings.npartitions
    if settings.scheduler is None:
        address = stack.enter_context(dask_cluster(settings.workers))
        npartitions = npartitions or 2 * settings.workers
    else:
        address = settings.scheduler
        _listening(address.split("://", 1)[1], "the Dask scheduler")
        handshake(address, settings.connect_timeout)
    return [f"--dask_client_address={address}", *([f"--dask_npartitions={npartitions}"] if npartitions else []),
            f"--dask_connection_timeout={settings.connect_timeout}", f"--dask_stall_seconds={settings.stall_seconds}",
            f"--dask_setup={settings.setup}"]


@contextmanager
def dask_cluster(workers: int) -> Iterator[str]:
    """A dask.distributed scheduler and ``workers`` single-threaded workers on this machine; yields its address.

    Each is a process of this interpreter started by :func:`_serving` (its own process group,
    stopped when the block ends, workers first).
    """
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    with ExitStack() as stack:
        stack.enter_context(_serving([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                      "--port", str(port), "--no-dashboard"], "the Dask scheduler", port))
        for n in range(workers):
            worker_port = _free_port()
            stack.enter_context(_serving([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads",
                                          "1", "--no-nanny", "--host", "127.0.0.1", "--worker-port",
                                          str(worker_port), "--no-dashboard"], f"Dask worker {n + 1}", worker_port))
        yield address


def _prism_binary(binary: str) -> str:
    """The Prism binary to start: the one named, or for ``auto`` the first way that works.

    ``auto`` takes ``prism`` from PATH, else ``$RATEBEAM_PRISM_BINARY`` (set by ratebeam's container
    image, which builds Prism at :data:`PRISM_VERSION`), else lets Beam fetch that release binary into its
    cache as Beam's ``PrismRunner`` does.  When all three fail, the one line names all three.
    """
    if binary != "auto":
        if not _executable(binary):
            raise RunnerUnavailable(f"Prism not found: {binary} is not an executable file (install it: {PRISM_INSTALL})")
        return binary
    found = shutil.which("prism")
    if found is not None:
        return found
    image = os.environ.get(PRISM_ENV)
    if image:
        if not _executable(image):
            raise RunnerUnavailable(f"Prism not found: {PRISM_ENV}={image} is not an executable file")
        return image
    return _prism_from_beam()


def _prism_from_beam() -> str:
    """Prism as Beam's ``PrismRunner`` gets it: the release binary of :data:`PRISM_VERSION`, in Beam's cache.

    ``PrismJobServer.local_bin`` downloads the release zip once into ``~/.apache_beam/cache/prism/bin``
    and unzips it there; later runs find it in the cache without the network.
    """
    import platform

    from apache_beam.runners.portability.prism_runner import PrismJobServer

    tag, cache = f"v{PRISM_VERSION}", PrismJobServer.BIN_CACHE
    try:
        server = PrismJobServer(PipelineOptions([f"--prism_beam_version_override={tag}"]))
        url = server.construct_download_url(tag, platform.system(), platform.machine())
        if not os.path.exists(os.path.join(cache, os.path.basename(url))):
            _LOG.info("fetching Prism %s (Beam's release binary) from %s into %s", tag, url, cache)
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(DOWNLOAD_SECONDS)  # Beam's urlopen has no timeout of its own
        try:
            return PrismJobServer.local_bin(url, cache)  # unzipped there too (the default is the cwd)
        finally:
            socket.setdefaulttimeout(previous)
    except (RuntimeError, ValueError, OSError, zipfile.BadZipFile) as exc:  # what Beam raises on the way
        raise RunnerUnavailable(
            f"Prism not found: no 'prism' on PATH, {PRISM_ENV} is not set (ratebeam's container image sets it), "
            f"and Beam could not fetch Prism {tag} into its cache {cache}: {' '.join(str(exc).split())[:300]} "
            f"(install it: {PRISM_INSTALL}; or name it in the runner config: prism: {{binary: /path/to/prism}})"
        ) from None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _check_flink_job_server(options: list[str]) -> None:
    """Refuse now, in one line, a FlinkRunner whose job server cannot start.

    Beam's FlinkRunner starts the Flink job server from a jar it downloads from Maven Central; when
    that cannot work this says so instead of a Beam traceback later.
    """
    from apache_beam.runners.portability.flink_runner import MAGIC_HOST_NAMES, FlinkJarJobServer
    from apache_beam.utils.subprocess_server import JavaJarServer

    flink = PipelineOptions(options).view_as(FlinkRunnerOptions)
    uber_jar = flink.flink_submit_uber_jar and flink.flink_master not in MAGIC_HOST_NAMES
    if not uber_jar and shutil.which("java") is None:
        raise RunnerUnavailable("FlinkRunner starts Beam's Flink job server, a Java program: no 'java' on PATH")
    download_log = logging.getLogger("apache_beam.utils.subprocess_server")
    level = download_log.level
    download_log.setLevel(logging.ERROR)  # Beam's multi-line warnings about downloading from Maven
    try:
        jar = FlinkJarJobServer(PipelineOptions(options)).path_to_jar()
        JavaJarServer.local_jar(jar)  # downloads into Beam's jar cache once, then finds it there
    except (ValueError, OSError, RuntimeError) as exc:  # what Beam raises here (URLError is an OSError)
        raise RunnerUnavailable(
            f"FlinkRunner cannot get Beam's Flink job server jar: {' '.join(str(exc).split())[:300]} "
            "(give --flink_job_server_jar=<path> or --job_endpoint=<host:port of a running job server>)"
        ) from None
    finally:
        download_log.setLevel(level)


def _check_runner_options(endpoint: str, runner_options: tuple[str, ...]) -> None:
    """Refuse a runner option the job server does not define (Beam would drop it silently)."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        described = beam_job_api_pb2_grpc.JobServiceStub(channel).DescribePipelineOptions(
            beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=30)
    known = {o.name for o in described.options}
    for option in runner_options:
        if option[2:].split("=", 1)[0] not in known:
            raise RunnerUnavailable(f"runner_options: {option} is not an option of the job server at {endpoint} "
                                    f"(it has: {', '.join(sorted(known)) or 'none'})")


def _listening(endpoint: str, what: str) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise RunnerUnavailable(f"{what} does not answer at {endpoint}: {exc.strerror or exc}") from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _serving(command: list[str], what: str, port: int, env: dict[str, str] | None = None,
             log_path: Path | None = None) -> Iterator[str]:
    """``command`` running in its own process group until the block ends, and not a moment longer.

    Yields ``localhost:port`` once it listens.  The whole group is stopped (a worker pool's workers
    are its children); if ratebeam dies without stopping it (SIGKILL) the kernel kills it
    (``tethered.dies_with_parent``: the thread that enters the block must stay in it, as a ``with``
    does).  Its output goes to ``log_path`` (kept), or to a temporary file quoted if it
    does not start.
    """
    log_dir = Path(tempfile.mkdtemp(prefix="ratebeam-runner-"))
    log_path = log_path or log_dir / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   preexec_fn=dies_with_parent())
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = " ".join(log_path.read_text(errors="replace")[-600:].split())
                raise RunnerUnavailable(f"{what} did not start (`{' '.join(command)}`): {tail}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"localhost:{port}"
    finally:
        _stop(process)
        shutil.rmtree(log_dir, ignore_errors=True)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL to what is left of it after 15 s (or at once)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=15)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def prism_job_server(binary: str) -> AbstractContextManager[str]:
    """Prism's job server on a free local port (its web UI off); yields ``localhost:<port>``."""
    port = _free_port()
    return _serving([binary, "--job_port", str(port), "--serve_http=false"], "Prism", port)


@contextmanager
def worker_pool(log_path: Path | None = None) -> Iterator[str]:
    """A local pool of Python SDK worker processes (``worker_pool_main``) for an EXTERNAL environment.

    Yields its ``localhost:<port>``.  The pool starts each worker as ``python -c ...``:
    ``python`` is a wrapper first on PATH that runs ``pipelines.runners.sdk_worker`` (the worker's own
    metric short ids) on this interpreter (a venv's, with ratebeam), told the pool's pid so that it
    ends with the pool.  The pool logs one
    ``Starting worker`` line per worker process to ``log_path`` when given.
    """
    bin_dir = Path(tempfile.mkdtemp(prefix="ratebeam-python-"))
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\n{POOL_PID}=$PPID exec "{sys.executable}" -m ratebeam.pipelines.runners.sdk_worker "$@"\n')
    wrapper.chmod(0o755)
    port = _free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"]
    try:
        with _serving(command, "the SDK worker pool", port, env, log_path) as endpoint:
            yield endpoint
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
