"""Loads ``ratebeam.yaml`` once, at the edge, into frozen typed dataclasses.

Everything downstream (the pipeline graph, DoFns on workers) receives these objects, never raw
YAML, so a configuration mistake is reported before anything runs, as one ``InputError`` naming
the file, the key path and the value (``ratebeam.yaml: storage.backends[1].url: not a URL:
'htp:/x'``).  Unknown keys are refused.  Relative paths (the SQLite file, ``metrics``, the
collector's and storage's plain paths) are resolved against the YAML file's directory.  All classes
are picklable: Beam ships them to workers.

Each backend section is ``{backend: <name>, <its options>}``; the options are parsed by the entry
of ``FETCHERS`` / ``COLLECTORS`` / ``STORAGES`` for that name, so a new backend (prometheus,
influxdb, ...) adds its option class and one registry entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ratebeam.connectors.collectors.prometheus import config as config_prometheus
from ratebeam.connectors.storage.influxdb import config as config_influxdb
from ratebeam.connectors.storage.search import config as config_search
from ratebeam.pipelines.metrics_config import Where, load_metrics, read_yaml
from ratebeam.transforms.metric_defs import MetricsConfig


@dataclass(frozen=True)
class SourceFetcherConfig:
    """The ``source`` fetcher: a static list of scope ids (CloudKitty's ``fetcher_source``)."""

    scopes: tuple[str, ...]


@dataclass(frozen=True)
class FileCollectorConfig:
    """The ``file`` collector: usage files at an fsspec URL or path (a file, a directory or a glob)."""

    url: str
    format: str = "auto"


@dataclass(frozen=True)
class ParquetStorageConfig:
    """The ``parquet`` storage backend: a dataset at an fsspec URL or path."""

    url: str


FetcherOptions = SourceFetcherConfig
CollectorOptions = FileCollectorConfig
StorageOptions = ParquetStorageConfig


@dataclass(frozen=True)
class FetcherConfig:
    backend: str
    options: FetcherOptions


@dataclass(frozen=True)
class CollectorConfig:
    backend: str
    options: CollectorOptions


@dataclass(frozen=True)
class StorageConfig:
    backend: str
    options: StorageOptions


@dataclass(frozen=True)
class RatebeamConfig:
    """The whole validated ``ratebeam.yaml``; ``storage[0]`` is the backend reports read from."""

    source_path: Path
    database_url: str
    period: int
    wait_periods: int
    scope_key: str
    metrics: MetricsConfig
    metrics_path: Path
    max_periods_per_run: int
    lease_seconds: int
    rebatch_rows: int
    fetcher: FetcherConfig
    collector: CollectorConfig
    storage: tuple[StorageConfig, ...]


# ---- backend registries ----


@dataclass(frozen=True)
class BackendSpec:
    """Keys a backend section may hold (besides ``backend``) and how its options are built."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    build: Callable[[Where, dict[str, Any], Path], Any]


FILE_FORMATS = ("auto", "parquet", "csv", "jsonl")

FETCHERS: dict[str, BackendSpec] = {
    "source": BackendSpec(
        ("scopes",),
        (),
        lambda where, raw, base: SourceFetcherConfig(where.key("scopes").string_list(raw["scopes"], allow_empty=False)),
    ),
    "prometheus": BackendSpec(*config_prometheus.FETCHER_SPEC),
}
COLLECTORS: dict[str, BackendSpec] = {
    "file": BackendSpec(
        ("url",),
        ("format",),
        lambda where, raw, base: FileCollectorConfig(
            _location(where.key("url"), raw["url"], base),
            where.key("format").choice(raw.get("format", "auto"), FILE_FORMATS, ", ".join(FILE_FORMATS)),
        ),
    ),
    "prometheus": BackendSpec(*config_prometheus.COLLECTOR_SPEC),
}
STORAGES: dict[str, BackendSpec] = {
    "parquet": BackendSpec(
        ("url",), (), lambda where, raw, base: ParquetStorageConfig(_location(where.key("url"), raw["url"], base))
    ),
    "elasticsearch": BackendSpec(*config_search.SPEC),
    "opensearch": BackendSpec(*config_search.SPEC),
    "influxdb": BackendSpec(*config_influxdb.STORAGE_SPEC),
}


def _backend(where: Where, raw: object, registry: dict[str, BackendSpec], base: Path) -> tuple[str, Any]:
    if not isinstance(raw, dict):
        raise where.error("expected a mapping with a 'backend' key", raw)
    if "backend" not in raw:
        raise where.key("backend").error("required key is missing")
    name = where.key("backend").choice(raw["backend"], registry, ", ".join(registry))
    spec = registry[name]
    where.mapping(raw, required=("backend", *spec.required), optional=spec.optional)
    return name, spec.build(where, raw, base)


# ---- URLs and paths ----

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(//)?")


def _location(where: Where, value: object, base: Path) -> str:
    """An fsspec URL (``s3://b/k``, ``simplecache::s3://b/k``) kept as is, or a path made absolute."""
    text = where.string(value)
    *chain, last = text.split("::")
    known = set(fsspec.available_protocols())
    for protocol in chain:
        if protocol not in known:
            raise where.error(f"unknown fsspec protocol {protocol!r}", text)
    match = _SCHEME.match(last)
    if match is None:
        if chain:
            raise where.error("not a URL", text)
        resolved = str(base / Path(last).expanduser())
        return resolved + "/" if last.endswith("/") else resolved
    if not match.group(2) or len(last) == match.end():
        raise where.error("not a URL", text)
    if match.group(1).lower() not in known:
        raise where.error(f"unknown URL scheme {match.group(1)!r}", text)
    return text


_CREDENTIALS = re.compile(r"(//[^/:@]*:)[^@/]*@")


def _database_url(where: Where, value: object, base: Path) -> str:
    """A SQLAlchemy URL with a known dialect; a relative SQLite path is resolved against ``base``."""
    text = where.string(value)
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise where.error("not a database URL", _CREDENTIALS.sub(r"\1***@", text)) from None
    shown = url.render_as_string(hide_password=True)
    try:
        url.get_dialect()
    except NoSuchModuleError:
        raise where.error(f"unknown database dialect {url.drivername!r}", shown) from None
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        resolved = base / Path(database).expanduser()
        if str(resolved) != database:
            return url.set(database=str(resolved)).render_as_string(hide_password=False)
    return text


# ---- the file ----

_KEYS = (
    "database_url",
    "period",
    "wait_periods",
    "scope_key",
    "metrics",
    "max_periods_per_run",
    "lease_seconds",
    "rebatch_rows",
    "fetcher",
    "collector",
    "storage",
)
_REQUIRED = ("metrics", "fetcher", "collector", "storage")


def load_config(path: str | Path) -> RatebeamConfig:
    """Read and validate ``ratebeam.yaml`` (and the ``metrics.yml`` it names) once."""
    source = str(path)
    source_path = Path(path).resolve()
    base = source_path.parent
    top = Where(source)
    raw = top.mapping(read_yaml(path, source), required=_REQUIRED, optional=_KEYS)

    def integer(key: str, default: int, minimum: int) -> int:
        return top.key(key).integer(raw.get(key, default), minimum)

    if "database_url" in raw:
        database_url = _database_url(top.key("database_url"), raw["database_url"], base)
    else:
        database_url = URL.create("sqlite", database=str(base / "ratebeam.db")).render_as_string()
    scope_key = top.key("scope_key").string(raw.get("scope_key", "project_id"))
    fetcher = FetcherConfig(*_backend(top.key("fetcher"), raw["fetcher"], FETCHERS, base))
    collector = CollectorConfig(*_backend(top.key("collector"), raw["collector"], COLLECTORS, base))

    storage_where = top.key("storage")
    storage_raw = storage_where.mapping(raw["storage"], required=("backends",))
    backends_where = storage_where.key("backends")
    backends = storage_raw["backends"]
    if not isinstance(backends, list) or not backends:
        raise backends_where.error("expected a non-empty list of storage backends", backends)
    storage = tuple(
        StorageConfig(*_backend(backends_where.index(i), item, STORAGES, base)) for i, item in enumerate(backends)
    )

    period = integer("period", 3600, 1)
    wait_periods = integer("wait_periods", 2, 0)
    max_periods_per_run = integer("max_periods_per_run", 744, 1)
    lease_seconds = integer("lease_seconds", 3600, 1)
    rebatch_rows = integer("rebatch_rows", 50000, 1)

    metrics_text = top.key("metrics").string(raw["metrics"])
    metrics_path = base / Path(metrics_text).expanduser()
    if not metrics_path.is_file():
        raise top.key("metrics").error("no such file", str(metrics_path))
    metrics = load_metrics(metrics_path, scope_key, collector.backend)

    return RatebeamConfig(
        source_path=source_path,
        database_url=database_url,
        period=period,
        wait_periods=wait_periods,
        scope_key=scope_key,
        metrics=metrics,
        metrics_path=metrics_path,
        max_periods_per_run=max_periods_per_run,
        lease_seconds=lease_seconds,
        rebatch_rows=rebatch_rows,
        fetcher=fetcher,
        collector=collector,
        storage=storage,
    )
