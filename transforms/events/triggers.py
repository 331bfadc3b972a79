"""Trigger definitions (seed 002, *Event Triggers*): which events a trigger collects, when it fires or expires.

The file is a list of definitions::

    - name: instance_lifecycle             # unique
      distinguished_by: [instance_id]      # one trigger instance per distinct value(s)
      match_criteria:                      # an event is collected when it meets ANY criterion
        - event_type: compute.instance.*
          traits: {state: "is not NULL"}
      fire_criteria:                       # the instance fires when EVERY criterion has `number` events
        - event_type: compute.instance.delete.end
          number: 1
      expiration: last+32d                 # a time expression (optional: never)
      fire_delay: 300                      # seconds or a duration (5m): stragglers' grace
      load_criteria: []                    # optional, as match_criteria (events to load before firing)
      fire_pipeline: lifecycle
      expire_pipeline: lifecycle           # optional

A criterion is ``{event_type: glob | [globs], timestamp: time condition, traits: {name: value}}``
(fire criteria add ``number``, default 1); values follow ``transforms.events.conditions``.  Every
criterion also requires the ``distinguished_by`` traits to be present.  ``first``/``last`` in a
criterion are the instance's earliest and latest events; ``TriggerSet.matches`` sees one event
alone, so for it they are that event's time — ``TriggerInstance.add`` checks again against the
instance it joins.  A mistake is one ``TriggerDefinitionError``: file, key path, value.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ratebeam.transforms.events.conditions import (
    Condition,
    ConditionError,
    TimeExpr,
    duration_seconds,
    literal,
    parse,
    parse_time,
)
from ratebeam.transforms.events.event_types import EventTypes
from ratebeam.transforms.events.located import LocatedError, at, mapping, text, texts
from ratebeam.transforms.events.model import Event, TraitValue

_KEYS = ("name", "distinguished_by", "match_criteria", "fire_criteria", "expiration", "fire_delay",
         "load_criteria", "fire_pipeline", "expire_pipeline")
_REQUIRED = ("name", "distinguished_by", "match_criteria", "fire_criteria", "fire_pipeline")


class TriggerDefinitionError(LocatedError):
    """The triggers file is wrong: ``file: key path: what: value``."""


@dataclass(frozen=True)
class Criterion:
    """Which events a criterion takes; ``number``: how many a fire criterion needs."""

    event_types: EventTypes
    timestamp: Condition | None
    traits: tuple[tuple[str, Condition], ...]
    number: int = 1

    def __call__(self, event: Event, first: datetime, last: datetime) -> bool:
        """Whether ``event`` meets the criterion for an instance spanning ``first``..``last``."""
        return (self.event_types(event.event_type)
                and (self.timestamp is None or self.timestamp(event.generated, first, last))
                and all(condition(event.trait(name), first, last) for name, condition in self.traits))


@dataclass(frozen=True)
class TriggerDefinition:
    """One trigger of the file, parsed (see the module docstring)."""

    name: str
    distinguished_by: tuple[str, ...]
    match_criteria: tuple[Criterion, ...]
    fire_criteria: tuple[Criterion, ...]
    expiration: TimeExpr | None
    fire_delay: timedelta
    load_criteria: tuple[Criterion, ...]
    fire_pipeline: str
    expire_pipeline: str | None

    def key(self, event: Event) -> tuple[TraitValue, ...] | None:
        """The distinguishing trait values of ``event`` (``None`` when it lacks one)."""
        values = tuple(event.trait(name) for name in self.distinguished_by)
        return None if any(v is None for v in values) else values

    def collects(self, event: Event, first: datetime, last: datetime) -> bool:
        """Whether ``event`` joins an instance spanning ``first``..``last`` (any match criterion)."""
        return self.key(event) is not None and any(c(event, first, last) for c in self.match_criteria)

    def loads(self, event: Event, first: datetime, last: datetime) -> bool:
        """Whether a stored ``event`` is to be loaded for an instance spanning first..last (any load criterion).

        The caller queries its store with this before running a pipeline (seed 002's ``load_criteria``);
        the instance's own distinguishing traits are required, as for every criterion.
        """
        return self.key(event) is not None and any(c(event, first, last) for c in self.load_criteria)

    def fire_criteria_met(self, events: list[Event]) -> bool:
        """Whether ``events`` (an instance's, sorted) hold ``number`` matches of every fire criterion."""
        if not events:
            return False
        first, last = events[0].generated, events[-1].generated
        return all(sum(1 for e in events if c(e, first, last)) >= c.number for c in self.fire_criteria)


@dataclass(frozen=True)
class TriggerSet:
    """Every trigger of the file, in file order."""

    triggers: tuple[TriggerDefinition, ...]

    @classmethod
    def from_yaml_data(cls, data: Any, source: str, pipelines: Collection[str] | None = None) -> TriggerSet:
        """The triggers of a loaded YAML document; ``pipelines``: the known pipeline names, if checked.

        Raises ``TriggerDefinitionError`` naming ``source``, the key path and the value.
        """
        if not isinstance(data, list):
            raise TriggerDefinitionError(source, "", "expected a list of trigger definitions", data)
        triggers = [_trigger(item, source, at("", n), pipelines) for n, item in enumerate(data)]
        seen: set[str] = set()
        for n, trigger in enumerate(triggers):
            if trigger.name in seen:
                raise TriggerDefinitionError(source, at(at("", n), "name"), "a second trigger of that name",
                                             trigger.name)
            seen.add(trigger.name)
        return cls(tuple(triggers))

    def trait_names(self) -> frozenset[str]:
        """Every trait the triggers read: their distinguishing traits and their criteria's traits."""
        names = {name for t in self.triggers for name in t.distinguished_by}
        for t in self.triggers:
            for criterion in (*t.match_criteria, *t.fire_criteria, *t.load_criteria):
                names.update(name for name, _ in criterion.traits)
        return frozenset(names)

    def by_name(self, name: str) -> TriggerDefinition:
        """The trigger called ``name`` (``KeyError`` if none)."""
        for trigger in self.triggers:
            if trigger.name == name:
                return trigger
        raise KeyError(name)

    def matches(self, event: Event) -> list[tuple[TriggerDefinition, tuple[TraitValue, ...]]]:
        """The triggers that collect ``event`` alone, each with the distinguishing key of its instance."""
        out = []
        for trigger in self.triggers:
            key = trigger.key(event)
            if key is not None and trigger.collects(event, event.generated, event.generated):
                out.append((trigger, key))
        return out


def _trigger(item: Any, source: str, path: str, pipelines: Collection[str] | None) -> TriggerDefinition:
    entry = mapping(item, TriggerDefinitionError, source, path, _KEYS, _REQUIRED)
    name = text(entry["name"], TriggerDefinitionError, source, at(path, "name"))
    distinguished = texts(entry["distinguished_by"], TriggerDefinitionError, source, at(path, "distinguished_by"))
    expiration = None
    if entry.get("expiration") is not None:
        where = at(path, "expiration")
        expiration = _condition(parse_time, text(entry["expiration"], TriggerDefinitionError, source, where),
                                source, where)
    fire_pipeline = _pipeline(entry["fire_pipeline"], source, at(path, "fire_pipeline"), pipelines)
    expire_pipeline = None
    if entry.get("expire_pipeline") is not None:
        expire_pipeline = _pipeline(entry["expire_pipeline"], source, at(path, "expire_pipeline"), pipelines)
    return TriggerDefinition(
        name=name,
        distinguished_by=distinguished,
        match_criteria=_criteria(entry["match_criteria"], source, at(path, "match_criteria"), fire=False),
        fire_criteria=_criteria(entry["fire_criteria"], source, at(path, "fire_criteria"), fire=True),
        expiration=expiration,
        fire_delay=timedelta(seconds=_delay(entry.get("fire_delay", 0), source, at(path, "fire_delay"))),
        load_criteria=_criteria(entry.get("load_criteria") or [], source, at(path, "load_criteria"), fire=False,
                                required=False),
        fire_pipeline=fire_pipeline,
        expire_pipeline=expire_pipeline,
    )


def _pipeline(value: Any, source: str, path: str, pipelines: Collection[str] | None) -> str:
    name = text(value, TriggerDefinitionError, source, path)
    if pipelines is not None and name not in pipelines:
        raise TriggerDefinitionError(source, path, f"unknown pipeline (expected one of: {', '.join(sorted(pipelines))})",
                                     name)
    return name


def _delay(value: Any, source: str, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise TriggerDefinitionError(source, path, "expected seconds >= 0", value)
        value = str(value)
    if not isinstance(value, str):
        raise TriggerDefinitionError(source, path, "expected seconds or a duration (90s, 5m, 1h)", value)
    return _condition(duration_seconds, value, source, path)


def _condition(parse_with: Any, value: str, source: str, path: str) -> Any:
    try:
        return parse_with(value)
    except ConditionError as exc:
        raise TriggerDefinitionError(source, path, exc.reason, value) from None


def _criteria(value: Any, source: str, path: str, *, fire: bool, required: bool = True) -> tuple[Criterion, ...]:
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or (required and not items):
        raise TriggerDefinitionError(source, path, "expected a criterion or a non-empty list of criteria", value)
    return tuple(_criterion(item, source, at(path, n), fire) for n, item in enumerate(items))


def _criterion(item: Any, source: str, path: str, fire: bool) -> Criterion:
    keys = ("event_type", "timestamp", "traits", "number") if fire else ("event_type", "timestamp", "traits")
    entry = mapping(item, TriggerDefinitionError, source, path, keys)
    types = EventTypes.parse(texts(entry.get("event_type", "*"), TriggerDefinitionError, source,
                                   at(path, "event_type")))
    timestamp = None
    if "timestamp" in entry:
        where = at(path, "timestamp")
        timestamp = _condition(parse, text(entry["timestamp"], TriggerDefinitionError, source, where), source, where)
    traits_data = entry.get("traits") or {}
    if not isinstance(traits_data, dict):
        raise TriggerDefinitionError(source, at(path, "traits"), "expected a mapping of trait names to values",
                                     traits_data)
    traits = []
    for name, value in traits_data.items():
        where = at(at(path, "traits"), str(name))
        if not isinstance(name, str) or not name:
            raise TriggerDefinitionError(source, where, "trait names must be non-empty strings", name)
        try:
            traits.append((name, literal(value)))
        except ConditionError as exc:
            raise TriggerDefinitionError(source, where, exc.reason, value) from None
    number = entry.get("number", 1)
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise TriggerDefinitionError(source, at(path, "number"), "expected an integer >= 1", number)
    return Criterion(types, timestamp, tuple(traits), number)
