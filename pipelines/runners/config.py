"""Runner option files (``runner_configs/*.yaml``): which Beam runner, with which options.

A file is::

    runner: PortableRunner            # FnApiRunner, DirectRunner, FlinkRunner, PortableRunner, ...
    prism: {binary: auto}             # PortableRunner only: start Prism (on PATH, or a path) ...
    # prism: {endpoint: host:port}    #   ... or use a job server that is already running
    environment: {type: LOOPBACK}     # or {type: EXTERNAL} (a pool started here), {type: EXTERNAL, endpoint: host:port}
    options: [--flag=value, ...]      # any other option of Beam's Python SDK
    runner_options: [--flag=value]    # options the runner's job server defines (Flink's
                                      #   --checkpointing_interval): checked against its own list
    resource_hints: {Rate: {min_ram: 2GB}}   # Beam resource hints of stages of the cycle
    dask: {scheduler: tcp://host:8786}       # DaskRunner only: a dask.distributed scheduler, or
    # dask: {workers: 2}                      #   a local cluster ratebeam starts (docs/dask.md)
    #   connect_timeout: 20, stall_seconds: 300, setup: worker   # DaskRunner's limits (DaskSettings)

A stage with resource hints is its own SDK environment: Prism runs it in a worker process of its
own (Prism starts one per environment), Dataflow sizes its workers by them.

It is validated here, at the edge, read like every other YAML file (a repeated key is refused), so
a typo gives one clear message instead of a Beam traceback.  Beam itself *silently discards* a flag
it does not know (``--paralelism=4`` would just be ignored), so every option name is checked
against the parser Beam builds from all its ``PipelineOptions`` classes; a runner's own options
(``runner_options``) are known only to its job server, which Beam asks at submission time, so
``runners.launched`` checks them against the job server's list before the run.  The options ratebeam sets
from the file's own keys (``--runner``; ``--job_endpoint`` with ``prism``; ``--environment_type``
and ``--environment_config`` with ``environment``) may not be given twice.  A relative path is
looked for in the current directory, then among the files installed with ratebeam
(``ratebeam/runner_configs``), so ``--runner-config prism.yaml`` works anywhere.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StringConstraints, model_validator

from ratebeam.connectors.config_model import NOTHING, ConfigModel, Invalid, NonEmptyStr, choice
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.validation import validate
from ratebeam.pipelines.yaml_loader import read_yaml

RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "FlinkRunner", "PortableRunner", "DaskRunner")
#: Options ratebeam writes from a key of the file (when that key is there): not in ``options`` too.
_OWN_FLAGS = {"runner": "runner", "job_endpoint": "prism", "environment_type": "environment",
              "environment_config": "environment"}

#: The stages of the cycle (``pipelines.cycle.build_cycle``) that may have resource hints.
CYCLE_STAGES = ("FetchScopes", "PlanPeriods", "CollectUsage", "ConvertUsage", "Rate", "Write", "CommitState")
#: The stages of the event stream (``pipelines.events.graph.build_events``) that may have resource hints.
EVENT_STAGES = ("ReadNotifications", "Scopes", "Rate", "Write", "Commit")

Endpoint = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")]
SchedulerAddress = Annotated[str, StringConstraints(pattern=r"^(tcp|tls)://[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")]


class _Parser(argparse.ArgumentParser):
    """Beam's option parser, raising instead of exiting on a bad value."""

    def error(self, message: str):
        raise Invalid(message)


def _beam_parser() -> argparse.ArgumentParser:
    """Every option of every Beam ``PipelineOptions`` class.

    Collected as ``PipelineOptions.get_all_options`` does (direct subclasses; the last class of a
    name wins).
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    parser = _Parser(allow_abbrev=False, add_help=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # the hook Beam itself calls
    return parser


def _flag_list(value: Any) -> tuple[str, ...]:
    options = value or []
    if not isinstance(options, list) or not all(isinstance(o, str) and o.startswith("--") for o in options):
        raise Invalid("must be a list of '--flag=value' strings")
    return tuple(options)


def _flags(value: Any) -> tuple[str, ...]:
    options = _flag_list(value)
    for n, option in enumerate(options):
        try:
            _, unknown = _beam_parser().parse_known_args([option])
        except Invalid as exc:
            raise Invalid(exc.message, option, (n,)) from None
        if unknown:
            raise Invalid("not a Beam pipeline option (Beam would silently ignore it)", option, (n,))
    return options


Flags = tuple[Annotated[str, StringConstraints(pattern=r"^--")], ...]


def _resource_hints(value: Any) -> dict[str, dict[str, str]]:
    """``{stage: {hint: value}}`` with stages of the cycle or the event stream and hints Beam knows (Beam's parser)."""
    from apache_beam.transforms.resources import parse_resource_hints

    if not isinstance(value, dict):
        raise Invalid("must map stages of the cycle or the event stream to resource hints, e.g. {Rate: {min_ram: 2GB}}")
    stages = dict.fromkeys((*CYCLE_STAGES, *EVENT_STAGES))
    texts: dict[str, dict[str, str]] = {}
    for stage, hints in value.items():
        if stage not in stages:
            raise Invalid(f"not a stage of the cycle or the event stream (one of {', '.join(stages)})", stage, (stage,))
        if not isinstance(hints, dict) or not hints:
            raise Invalid("must be a mapping of resource hints, e.g. {min_ram: 2GB}", hints, (stage,))
        texts[stage] = {name: str(v) for name, v in hints.items()}  # YAML's `cpu_count: 1` is an int
        try:
            parse_resource_hints(texts[stage])
        except ValueError as exc:
            raise Invalid(str(exc), hints, (stage,)) from None
    return texts


class PrismSettings(ConfigModel):
    """Prism, Beam's portable runner: a binary ratebeam starts, or a job server already running.

    ``binary: auto`` is ``prism`` on PATH; ``endpoint`` is the ``host:port`` of a running Prism (or
    any Beam job server).
    """

    binary: NonEmptyStr | None = Field(None, description="`auto` (`prism` on PATH) or the path of a Prism binary ratebeam starts for the run.")
    endpoint: Endpoint | None = Field(None, description="`host:port` of a Prism (or any Beam job server) already running.")

    @model_validator(mode="after")
    def _one_source(self) -> PrismSettings:
        if self.binary is not None and self.endpoint is not None:
            raise Invalid("give either binary or endpoint, not both", NOTHING)
        return self

    @property
    def start_binary(self) -> str | None:
        """The binary to start (``auto`` when nothing was said), None when an endpoint is given."""
        return None if self.endpoint else (self.binary or "auto")


class EnvironmentSettings(ConfigModel):
    """Where the Python SDK workers run.

    ``LOOPBACK``: in the ratebeam process (local runners only); ``EXTERNAL``: a worker pool
    (``worker_pool_main``) at ``endpoint``, or one ratebeam starts on this machine when no endpoint
    is given.
    """

    type: choice(("LOOPBACK", "EXTERNAL")) = Field(description="Where the Python SDK workers run: `LOOPBACK` (in ratebeam) or `EXTERNAL` (a worker pool).")
    endpoint: Endpoint | None = Field(None, description="`host:port` of an existing worker pool (EXTERNAL); absent: ratebeam starts one.")

    @model_validator(mode="after")
    def _consistent(self) -> EnvironmentSettings:
        if self.type == "LOOPBACK" and self.endpoint:
            raise Invalid("LOOPBACK runs the worker in ratebeam itself: no endpoint", NOTHING)
        return self


class DaskSettings(ConfigModel):
    """The dask.distributed cluster of a ``DaskRunner``: a running scheduler, or a local one started here.

    ``scheduler`` is its address (``tcp://host:8786``), reached by ratebeam and by the workers;
    without it ratebeam starts a scheduler and ``workers`` worker processes (one thread each) on
    this machine for the run.  ``npartitions``: how many partitions the work items are spread over
    (default: twice the cluster's worker threads).  ``connect_timeout``: seconds the scheduler has to
    complete Dask's handshake (whatever else listens at the address is named, exit 2).
    ``stall_seconds``: a job that made no progress for that long (no element done, no task started
    or finished, e.g. a frozen worker) is cancelled, exit 1.  ``setup``: a DoFn is set up once per
    ``worker`` (reused by its bundles) or once per ``partition``.
    """

    scheduler: SchedulerAddress | None = Field(None, description="The address of a dask.distributed scheduler; absent: a local cluster ratebeam starts and stops.")
    workers: Annotated[int, Field(ge=1, le=256)] = Field(2, description="Worker processes of the local cluster.")
    npartitions: Annotated[int, Field(ge=1)] | None = Field(None, description="Partitions of each collection (default: Beam's DaskRunner's).")
    connect_timeout: Annotated[int, Field(ge=1, le=3600)] = Field(20, description="Seconds the scheduler has to complete Dask's handshake; anything else answering at the address is refused in one line.")
    stall_seconds: Annotated[float, Field(ge=5)] = Field(300.0, description="A job with no task progress for this long is cancelled, its leases released, exit 1.")
    setup: choice(("worker", "partition")) = Field("worker", description="How often each DoFn is set up: once per worker (its clients and the file collector's index kept), or once per partition.")

    @model_validator(mode="after")
    def _one_cluster(self) -> DaskSettings:
        if self.scheduler is not None and "workers" in self.model_fields_set:
            raise Invalid("workers is the size of the local cluster ratebeam starts: not with a scheduler", NOTHING,
                          ("workers",))
        return self


class RunnerConfig(ConfigModel):
    """One runner config file."""

    runner: choice(RUNNERS, ", ".join(RUNNERS)) = Field(description="The Beam runner.")
    prism: PrismSettings | None = Field(None, description="Prism: a binary ratebeam starts, or a running job server.")
    environment: EnvironmentSettings | None = Field(None, description="The SDK worker environment (portable runners).")
    options: Annotated[Flags, BeforeValidator(_flags)] = Field((), description="Beam Python SDK options (`--flag=value`), each checked against Beam's parser.")
    runner_options: Annotated[Flags, BeforeValidator(_flag_list)] = Field((), description="The job server's own options (e.g. Flink's `--checkpointing_interval=60000`), checked against its list when it can be reached.")
    resource_hints: Annotated[dict[str, dict[str, str]], BeforeValidator(_resource_hints)] = Field({}, description="Beam resource hints per stage of the cycle or the event stream, e.g. `{Rate: {min_ram: 2GB}}`.")
    dask: DaskSettings | None = Field(None, description="DaskRunner only: the cluster.")

    @model_validator(mode="after")
    def _consistent(self) -> RunnerConfig:
        for n, option in enumerate(self.options):
            key = _OWN_FLAGS.get(option[2:].split("=", 1)[0])
            if key == "runner" or (key is not None and getattr(self, key) is not None):
                raise Invalid(f"set by the '{key}' key of this file, not in options", option, ("options", n))
        if self.runner == "PortableRunner" and self.prism is None and not self._has("job_endpoint"):
            raise Invalid("PortableRunner needs a job server: a 'prism' section or --job_endpoint=host:port",
                          NOTHING, ("runner",))
        if self.prism is not None and self.runner != "PortableRunner":
            raise Invalid("prism needs runner: PortableRunner", NOTHING, ("prism",))
        if self.dask is not None and self.runner != "DaskRunner":
            raise Invalid("dask needs runner: DaskRunner", NOTHING, ("dask",))
        if self.runner == "DaskRunner" and self.resource_hints:
            raise Invalid("the Dask runner takes no resource hints (size its workers instead)", NOTHING,
                          ("resource_hints",))
        if self.environment is not None and self.runner not in ("PortableRunner", "FlinkRunner"):
            raise Invalid("environment needs a portable runner (PortableRunner, FlinkRunner)", NOTHING,
                          ("environment",))
        return self

    def _has(self, flag: str) -> bool:
        return any(o[2:].split("=", 1)[0] == flag for o in self.options)


def runner_config_path(name: str | Path) -> Path:
    """The runner config file ``name`` names.

    ``name`` as given if it exists (relative to the current directory), else the runner config of
    that name installed with ratebeam; an ``InputError`` naming both places otherwise.
    """
    path = Path(name)
    if path.exists() or path.is_absolute():
        return path
    installed = resources.files("ratebeam.runner_configs")
    if (installed / str(path)).is_file():
        return Path(str(installed / str(path)))
    raise InputError(str(name), "(file)", f"no such runner config here nor in {installed}")


def load_runner_config(name: str | Path) -> RunnerConfig:
    """The validated runner config file ``name`` (see ``runner_config_path``)."""
    path = runner_config_path(name)
    return validate(RunnerConfig, read_yaml(path, str(name)), str(name))


def batch_runner_config(name: str | Path | None) -> RunnerConfig:
    """``--runner-config`` of a bounded command: the file ``name``, or FnApiRunner in memory when none is given."""
    return load_runner_config(name) if name else RunnerConfig(runner="FnApiRunner")
