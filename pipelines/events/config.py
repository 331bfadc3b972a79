"""``ratebeam.yaml``'s ``events:`` section: the event definitions, the triggers and the event pipelines.

```yaml
events:
  source: {transport_url: rabbit://user:pass@rabbit-1:5672/, exchanges: [nova, cinder, neutron]}
                                          # the bus (connectors/notifications/config.py); `events serve` needs it
  definitions: event_definitions.yaml     # Ceilometer's format; default: the package's (Nova, Cinder, Neutron)
  triggers: triggers.yaml                 # default: the package's lifecycle triggers
  allow_dropping_of_notifications: false  # Ceilometer's option: drop notifications no definition takes
  shard: 0/2                              # `events serve` rates shard K of N of the scopes (docs/events.md)
  pipelines:                              # default: the package's lifecycles.yaml (instance, volume, floatingip)
    instance: {type: instance, start_events: [...], end_events: [...], resource_trait: instance_id, ...}
```
Both files are read and checked when the configuration is loaded, like ``metrics.yml``: a mistake in
one is an ``InputError`` naming that file, its key path and the value; a trigger whose
``fire_pipeline`` / ``expire_pipeline`` is not one of ``pipelines`` is refused.  Relative paths are
resolved against ``ratebeam.yaml``'s directory.  The loaded objects (``definition_set``,
``trigger_set``) travel with the frozen, picklable model to the workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ratebeam.connectors.config_model import (
    DERIVED,
    Boolean,
    ConfigModel,
    Invalid,
    NonEmptyStr,
    NonEmptyStringList,
    StringList,
    base_dir,
    integer,
    known_keys,
)
from ratebeam.connectors.notifications.config import NotificationSourceConfig
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.validation import validate
from ratebeam.pipelines.yaml_loader import read_yaml
from ratebeam.transforms.events.definitions import EventDefinitions
from ratebeam.transforms.events.lifecycle import LifecycleSettings
from ratebeam.transforms.events.located import LocatedError
from ratebeam.transforms.events.triggers import TriggerSet

#: The package's default files (docs/events.md).
EVENTS_DATA = Path(__file__).parent / "data"
#: Loaded from the files, never written by the user.
_DERIVED = ("definition_set", "trigger_set")


class LifecycleConfig(ConfigModel):
    """One lifecycle pipeline: what it bills and which events start, resize and end it (globs)."""

    kind: Literal["lifecycle"] = Field("lifecycle", description="The pipeline kind (one: lifecycle).")
    type: NonEmptyStr = Field(description="The rating type of the rows (the hashmap service).")
    unit: NonEmptyStr = Field("second", description="The unit of the rows.")
    seconds_per_unit: integer(1, 366 * 86400) = Field(1, description="`qty` is the active seconds divided by this (3600: hours).")  # type: ignore[valid-type]  # built at run time (config_model)
    start_events: NonEmptyStringList = Field(description="Event types (globs) that open a segment.")
    end_events: NonEmptyStringList = Field(description="Event types (globs) that close it.")
    resize_events: StringList = Field((), description="Event types (globs) that cut it when its price traits change.")
    exists_events: StringList = Field((), description="Nova's periodic audit events (globs), used for reconciliation.")
    price_traits: StringList = Field((), description="Traits whose change cuts the segment.")
    groupby: StringList = Field((), description="Traits stored as the rows' groupby labels.")
    metadata: StringList = Field((), description="Traits stored as the rows' metadata labels.")
    scope_trait: NonEmptyStr = Field("tenant_id", description="The trait holding the scope id.")
    resource_trait: NonEmptyStr = Field(description="The trait identifying the resource (one trigger instance each).")
    qty_trait: NonEmptyStr | None = Field(None, description="A numeric trait the seconds are multiplied by (e.g. `size` for volumes: GB-seconds).")
    audit_begin_trait: NonEmptyStr = Field("audit_period_beginning", description="The audit event's period begin.")
    audit_end_trait: NonEmptyStr = Field("audit_period_ending", description="The audit event's period end.")
    launched_trait: NonEmptyStr | None = Field("launched_at", description="The trait of the resource's launch time, used when its start event was never seen.")

    def settings(self, scope_key: str) -> LifecycleSettings:
        """The pure settings ``lifecycle_usage`` takes; ``scope_key``: ratebeam.yaml's (a groupby key)."""
        fields = self.model_dump(exclude={"kind"})
        return LifecycleSettings(**fields, scope_key=scope_key)


def read_pipelines(path: Path, source: str) -> dict[str, LifecycleConfig]:
    """A YAML mapping of pipeline names to ``LifecycleConfig`` (the package's ``lifecycles.yaml``)."""
    return validate(_Pipelines, {"pipelines": read_yaml(path, source)}, source).pipelines


class _Pipelines(ConfigModel):
    pipelines: dict[NonEmptyStr, LifecycleConfig]


class EventsConfig(ConfigModel):
    """The validated ``events:`` section (see the module docstring)."""

    source: NotificationSourceConfig | None = Field(None, description="The notification bus; `events serve` needs it.")
    definitions: NonEmptyStr | None = Field(None, description="Event definitions in Ceilometer's format; default: the package's (Nova, Cinder, Neutron).")
    triggers: NonEmptyStr | None = Field(None, description="The triggers file; default: the package's lifecycle triggers.")
    allow_dropping_of_notifications: Boolean = Field(False, description="Ceilometer's option: drop notifications no definition takes.")
    pipelines: dict[NonEmptyStr, LifecycleConfig] | None = Field(None, description="Event pipelines by name; default: the package's (instance, volume, floating IP).")
    shard: NonEmptyStr | None = Field(None, description="`K/N`: `events serve` rates only the scopes of shard K of N (`--shard` overrides it); see [events.md](events.md#sharding).")
    #: Loaded from ``definitions`` / ``triggers`` once the section is valid (never None after loading).
    definition_set: EventDefinitions | None = Field(None, json_schema_extra=DERIVED)
    trigger_set: TriggerSet | None = Field(None, json_schema_extra=DERIVED)

    model_config = ConfigModel.model_config | {"arbitrary_types_allowed": True}

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        """Only the user's keys (the loaded objects are not written by the user); the default pipelines."""
        if isinstance(data, EventsConfig):
            return data
        known_keys(data, [k for k in cls.model_fields if k not in _DERIVED])
        if data.get("pipelines") is None:
            default = EVENTS_DATA / "lifecycles.yaml"
            return {**data, "pipelines": read_pipelines(default, str(default))}
        return data

    @field_validator("shard")
    @classmethod
    def _shard(cls, text: str) -> str:
        try:
            parse_shard(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return text

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> EventsConfig:
        """Read the two files once the section is valid (their errors name them)."""
        if self.definition_set is not None and self.trigger_set is not None:
            return self
        base = base_dir(info)
        names = set(self.pipelines or {})
        dropping = self.allow_dropping_of_notifications
        definitions = _read(self.definitions, base, "event_definitions.yaml",
                            lambda doc, source: EventDefinitions.from_yaml_data(doc, source, allow_dropping=dropping))
        triggers = _read(self.triggers, base, "triggers.yaml",
                         lambda doc, source: TriggerSet.from_yaml_data(doc, source, names))
        object.__setattr__(self, "definition_set", definitions)  # frozen: set once, while validating
        object.__setattr__(self, "trigger_set", triggers)
        return self

    def lifecycles(self, scope_key: str) -> dict[str, LifecycleSettings]:
        """Each pipeline's settings by name (what a trigger's ``fire_pipeline`` names)."""
        assert self.pipelines is not None  # filled by _keys
        return {name: p.settings(scope_key) for name, p in self.pipelines.items()}


#: The most shards a stream is split into (a job per shard; more than any deployment runs).
MAX_SHARDS = 1024


def parse_shard(text: str) -> tuple[int, int]:
    """``'K/N'`` → (K, N) with 0 ≤ K < N ≤ :data:`MAX_SHARDS`; else ``ValueError`` saying what is expected."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit()) or not 0 <= int(index) < int(count) <= MAX_SHARDS:
        raise ValueError(f"expected K/N, shard K of N, 0 <= K < N <= {MAX_SHARDS} (e.g. 0/2 and 1/2)")
    return int(index), int(count)


def _read(value: str | None, base: Path, default: str, parse: Any) -> Any:
    """The file ``value`` names (the package's ``default`` when absent), parsed; errors name the file."""
    if value is None:
        path, source = EVENTS_DATA / default, str(EVENTS_DATA / default)
    else:
        path, source = base / Path(value).expanduser(), value
    try:
        return parse(read_yaml(path, source), source)
    except LocatedError as exc:
        raise InputError(exc.source, exc.location, exc.message, *((exc.value,) if exc.has_value else ())) from None
