"""``ratebeam config check``: load everything a service would load, show the effective configuration.

Why: a service that starts with a bad value restarts in a loop, far from the person who set it.
This loads ``ratebeam.yaml`` with its environment and secret-file layers, ``metrics.yml``, the
event definitions and triggers of an ``events:`` section and, when given, a runner config — the
same loaders the commands use, so it refuses exactly what they would refuse (one line, exit 2) —
and prints every key with its value (secrets masked) and where it came from: the file, an
environment variable, a secret file, or the default.  It connects to nothing unless asked
(``--connect``: the database and its schema, the collector, the storage backends, the broker).
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

from ratebeam.pipelines.ops.environment import Layered, dotted, leaves, masked

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.runners.config import RunnerConfig

#: Fields of the model derived from others (or loaded from the files they name): shown as their source keys.
_DERIVED = {"metrics", "metrics_path", "source_path", "events"}


def effective(config: RatebeamConfig, layered: Layered) -> list[tuple[str, Any, str]]:
    """Every key of the effective configuration: (key path, value as shown, origin), in the file's order."""
    data: dict[str, Any] = config.model_dump(mode="json", exclude=_DERIVED)
    data["storage"] = {"backends": data["storage"]}
    if config.events is not None:
        data["events"] = config.events.model_dump(mode="json", exclude={"definition_set", "trigger_set"})
    rows = [(dotted(path), masked(path[-1] if path else "", value), layered.origin(path)) for path, value in leaves(data)]
    if config.metrics is not None:
        rows.insert(4, ("metrics", str(config.metrics_path), layered.origin(("metrics",))))
    return rows


def print_text(config: RatebeamConfig, layered: Layered, runner: RunnerConfig | None, out: IO[str]) -> None:
    """The effective configuration, one ``key = value  # origin`` line per key, then the loaded files."""
    rows = effective(config, layered)
    width = max(len(f"{k} = {json.dumps(v)}") for k, v, _ in rows)
    for key, value, origin in rows:
        print(f"{key} = {json.dumps(value)}".ljust(width) + f"  # {origin}", file=out)
    for line in _loaded(config, runner):
        print(line, file=out)


def as_json(config: RatebeamConfig, layered: Layered, runner: RunnerConfig | None) -> dict[str, Any]:
    """The same as one JSON object: ``keys`` (key → value and origin) and ``loaded`` (the files read)."""
    return {"keys": {k: {"value": v, "origin": o} for k, v, o in effective(config, layered)},
            "loaded": _loaded(config, runner)}


def _loaded(config: RatebeamConfig, runner: RunnerConfig | None) -> list[str]:
    lines = []
    if config.metrics is not None:
        lines.append(f"loaded {config.metrics_path}: {len(config.metrics.metrics)} metric(s)")
    events = config.events
    if events is not None and events.definition_set is not None and events.trigger_set is not None:
        lines.append(f"loaded event definitions {events.definitions or '(shipped)'} and triggers "
                     f"{events.triggers or '(shipped)'}")
    if runner is not None:
        lines.append(f"loaded runner config: runner {runner.runner}")
    return lines


def connect(config: RatebeamConfig) -> list[str]:
    """Open every server the configuration names, as the commands do at start; what each answered.

    A failure raises the command's own error (one line): the first server that does not answer stops the check.
    """
    from ratebeam.pipelines.commands.common import engine_of
    from ratebeam.pipelines.commands.run import check_collector, check_storage

    engine_of(config).dispose()
    done = ["connect: database ok (schema up to date)"]
    if config.metrics is not None:
        check_collector(config)
        done.append(f"connect: collector {config.collector.backend} ok")
    check_storage(config)
    done.append(f"connect: storage {', '.join(s.backend for s in config.storage)} ok")
    if config.events is not None and config.events.source is not None:
        from ratebeam.pipelines.ops.health import broker_check

        broker_check(config.events.source.broker_url)()
        done.append("connect: events broker ok")
    return done
