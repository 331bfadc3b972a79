"""Loads ``ratebeam.yaml`` once, at the edge, into one frozen pydantic model.

Everything downstream (the pipeline graph, DoFns on workers) receives this object, never raw YAML,
so a configuration mistake is reported before anything runs, as one ``InputError`` naming the
file, the key path and the value (``ratebeam.yaml: storage.backends[1].url: not a URL:
'htp:/x'``).  Unknown keys are refused, nothing is coerced (``period: '3600'`` is refused).
Relative paths (the SQLite file, ``metrics``, the collector's and storage's plain paths, CA files)
are resolved against the YAML file's directory, passed to the models as validation context.  The
model is picklable: Beam ships it to workers.

``fetcher``, ``collector`` and each of ``storage.backends`` is ``{backend: <name>, <its options>}``,
validated by the model the connector's own package defines (``connectors/<kind>s/<name>/config.py``):
a new connector adds its model to the union below and one line to ``connectors.registry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasPath, BeforeValidator, Field, ValidationInfo, field_validator, model_validator
from sqlalchemy.engine import URL

from ratebeam.connectors.collectors.aetos.config import AetosCollectorConfig
from ratebeam.connectors.collectors.file.config import FileCollectorConfig
from ratebeam.connectors.collectors.gnocchi.config import GnocchiCollectorConfig
from ratebeam.connectors.collectors.prometheus.config import PrometheusCollectorConfig
from ratebeam.connectors.config_model import (
    DERIVED,
    INPUT,
    NOTHING,
    ConfigModel,
    Invalid,
    NonEmptyStr,
    base_dir,
    integer,
    known_keys,
    sections,
    shown_type,
)
from ratebeam.connectors.fetchers.gnocchi.config import GnocchiFetcherConfig
from ratebeam.connectors.fetchers.keystone.config import KeystoneFetcherConfig
from ratebeam.connectors.fetchers.prometheus.config import PrometheusFetcherConfig
from ratebeam.connectors.fetchers.source.config import SourceFetcherConfig
from ratebeam.connectors.sql.engine import CREDENTIALS, UnusableDatabaseURL, usable_url
from ratebeam.connectors.storage.delta.config import DeltaStorageConfig
from ratebeam.connectors.storage.influxdb.config import InfluxDBStorageConfig
from ratebeam.connectors.storage.loki.config import LokiStorageConfig
from ratebeam.connectors.storage.parquet.config import ParquetStorageConfig
from ratebeam.connectors.storage.search.config import SearchStorageConfig
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.events.config import EventsConfig
from ratebeam.pipelines.metrics_config import load_metrics
from ratebeam.pipelines.ops.environment import Layered, layer, located
from ratebeam.pipelines.validation import validate
from ratebeam.pipelines.yaml_loader import read_yaml
from ratebeam.transforms.metric_defs import MetricsConfig

FetcherConfig = sections(SourceFetcherConfig, PrometheusFetcherConfig, GnocchiFetcherConfig, KeystoneFetcherConfig)
CollectorConfig = sections(FileCollectorConfig, PrometheusCollectorConfig, GnocchiCollectorConfig, AetosCollectorConfig)
StorageConfig = sections(
    ParquetStorageConfig, InfluxDBStorageConfig, SearchStorageConfig, LokiStorageConfig, DeltaStorageConfig
)

#: Keys of the file (``storage`` holds ``backends``); the other fields are derived from them.
_KEYS = (
    "database_url", "period", "wait_periods", "scope_key", "metrics", "max_periods_per_run",
    "lease_seconds", "rebatch_rows", "fetcher", "collector", "storage", "events",
)


def _backends(value: Any) -> Any:
    if not isinstance(value, list | tuple) or not value:
        raise Invalid("expected a non-empty list of storage backends")
    return tuple(value)


#: Bounds of the numbers (an unbounded one overflowed in the middle of a run, leases taken).
#: A period of at most a leap year, waited at most 1000 times, keeps every period begin and
#: ``begin + wait_periods * period`` inside the years ``datetime`` holds; a lease outlives a dead run
#: by at most a day; a catch-up and a rebatched batch fit in memory.
MAX_PERIOD = 366 * 86400
MAX_WAIT_PERIODS = 1000
MAX_PERIODS_PER_RUN = 1_000_000
MAX_LEASE_SECONDS = 86400
MAX_REBATCH_ROWS = 10_000_000


class RatebeamConfig(ConfigModel):
    """The whole validated ``ratebeam.yaml``; ``storage[0]`` is the backend reports read from."""

    database_url: NonEmptyStr = Field(description="The SQL database of state, rules and dead letters: a SQLAlchemy URL (`sqlite:///ratebeam.db`, `postgresql+psycopg://user@host/db`); default: `ratebeam.db` beside the file.")
    period: integer(1, MAX_PERIOD) = Field(3600, description="Seconds of one collection period (CloudKitty's `[collect]/period`).")
    wait_periods: integer(0, MAX_WAIT_PERIODS) = Field(2, description="A period is rated once `begin + wait_periods × period < now` (CloudKitty's `wait_periods`).")
    scope_key: NonEmptyStr = Field("project_id", description="The groupby label that holds the scope id (CloudKitty's `scope_key`).")
    max_periods_per_run: integer(1, MAX_PERIODS_PER_RUN) = Field(744, description="Catch-up cap: periods of one scope rated by one run (or tick).")
    lease_seconds: integer(1, MAX_LEASE_SECONDS) = Field(60, description="How long a scope lease outlives its run's last heartbeat (the run beats every third of it).")
    rebatch_rows: integer(1, MAX_REBATCH_ROWS) = Field(250_000, description="Rows per batch rated and written (frames are concatenated; memory grows with it).")
    fetcher: FetcherConfig = Field(description="Where the scopes come from.")
    collector: CollectorConfig = Field(description="Where the usage comes from.")
    storage: Annotated[tuple[StorageConfig, ...], BeforeValidator(_backends)] = Field(
        validation_alias=AliasPath("storage", "backends"),
        description="Where rated points go, in order; reports read the first.",
    )
    #: Validated after ``scope_key`` and ``collector``: the collector decides ``extra_args``' schema.
    #: None when loaded with ``load_config(..., metrics=False)`` (a command that never rates).
    #: Absent and loaded with ``metrics=None``: the event stream's commands (events-only configurations).
    metrics: MetricsConfig | None = Field(None, description="CloudKitty's `metrics.yml`, read as it is (relative to this file); required by the polling commands (`run`, `serve`, `reprocess`), not by an events-only configuration.",
                                          json_schema_extra=shown_type("path"))
    events: EventsConfig | None = Field(None, description="Event-driven usage from OpenStack notifications ([events.md](events.md)); none without this section.")
    metrics_path: Path | None = Field(None, json_schema_extra=DERIVED)
    source_path: Path = Field(json_schema_extra=DERIVED)

    model_config = ConfigModel.model_config | {"arbitrary_types_allowed": True}

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any, info: ValidationInfo) -> Any:
        """Check the file's keys, then add what is derived from them and from where the file is."""
        if isinstance(data, RatebeamConfig):
            return data
        known_keys(data, _KEYS)
        if "storage" in data:
            try:
                known_keys(data["storage"], ("backends",))
            except Invalid as exc:
                shown = data["storage"] if exc.value is INPUT else exc.value
                raise Invalid(exc.message, shown, ("storage", *exc.at)) from None
        context = info.context or {}
        base = base_dir(info)
        derived: dict[str, Any] = {"source_path": Path(context.get("source_path", base / "ratebeam.yaml"))}
        if isinstance(data.get("metrics"), str):
            derived["metrics_path"] = base / Path(data["metrics"]).expanduser()
        default_url = URL.create("sqlite", database=str(base / "ratebeam.db")).render_as_string()
        return {"database_url": default_url, **data, **derived}

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, text: str, info: ValidationInfo) -> str:
        """A database URL ratebeam can use (``usable_url``); a relative SQLite path is resolved against the base."""
        try:
            url = usable_url(text)
        except UnusableDatabaseURL as exc:
            raise Invalid(str(exc), CREDENTIALS.sub(r"\1***@", text)) from None
        database = url.database
        if url.get_backend_name() == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
            resolved = base_dir(info) / Path(database).expanduser()
            if str(resolved) != database:
                return url.set(database=str(resolved)).render_as_string(hide_password=False)
        return text

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, value: Any, info: ValidationInfo) -> Any:
        """``metrics.yml``, loaded for this scope key and collector (its errors name that file)."""
        if not isinstance(value, str) or not value:
            raise Invalid("expected a non-empty string")
        path = base_dir(info) / Path(value).expanduser()
        if not path.is_file():
            raise Invalid("no such file", str(path))
        if "scope_key" not in info.data or "collector" not in info.data:
            return None  # the error in either is the one reported
        if (info.context or {}).get("metrics") is False:
            return None  # not needed: a mistake in metrics.yml must not block e.g. ``db upgrade``
        return load_metrics(path, info.data["scope_key"], info.data["collector"].backend)

    @model_validator(mode="after")
    def _collector_takes_metrics(self, info: ValidationInfo) -> RatebeamConfig:
        """The collector's own check of the metrics (e.g. Prometheus' ``batched: true``), at ``collector``.

        ``metrics`` is required by the commands that poll (loaded with ``metrics=True``).
        """
        if self.metrics_path is None and (info.context or {}).get("metrics") is True:
            raise Invalid("required key is missing (the metrics file of the polling cycle)", NOTHING, ("metrics",))
        check = getattr(self.collector, "check_metrics", None)
        if self.metrics is not None and check is not None:
            try:
                check(self.metrics.metrics)
            except Invalid as exc:
                raise Invalid(exc.message, exc.value, ("collector", *exc.at)) from None
        return self


def load_config(path: str | Path, *, metrics: bool | None = True) -> RatebeamConfig:
    """Read and validate ``ratebeam.yaml`` (and, unless ``metrics`` is False, the ``metrics.yml`` it names).

    ``metrics=None``: the ``metrics`` key may be absent (an events-only configuration).
    The ``RATEBEAM_*`` environment variables and the secret files (``*_file`` keys,
    ``RATEBEAM_*_FILE``) are layered on the file first (``pipelines.ops.environment``).
    """
    return load_layered(path, metrics=metrics)[0]


def load_layered(path: str | Path, *, metrics: bool | None = True,
                 environ: Mapping[str, str] | None = None) -> tuple[RatebeamConfig, Layered]:
    """The validated configuration and the layered data it came from (with each value's origin).

    A mistake in a value set by the environment names its variable, not the file; a secret's
    value is never shown in a message.
    """
    source = str(path)
    data = read_yaml(path, source)  # first: a missing file or a symlink loop is its InputError
    source_path = Path(path).resolve()
    layered = layer(data, source, _KEYS, source_path.parent, environ)
    context = {"base": source_path.parent, "source_path": source_path, "metrics": metrics}
    try:
        return validate(RatebeamConfig, layered.data, source, context), layered
    except InputError as exc:
        raise located(exc, layered) from None
