"""Notifications → events, driven by an ``event_definitions.yaml`` in Ceilometer's format (seed 002).

The file is a list of definitions ``{event_type: glob | [globs], traits: {name: trait}}``; a trait
is ``{type: text|int|float|datetime, fields: path | [paths], plugin: name | {name, parameters}}``
or just its path.  Semantics, as Ceilometer's converter has them:

* the list is scanned **last to first**; the first definition whose ``event_type`` takes the
  notification's type is used (``!glob`` excludes, exclusions alone take everything else);
* ``fields`` are JSONPath (jsonpath-ng's extended syntax, Ceilometer's ``jsonpath_rw_ext``) over the
  notification body (``Notification.body``: ``payload``, ``publisher_id``, ``ctxt``...); the
  non-null matches of the paths, in the order written, are the candidates and the first wins (a
  plugin sees them all and may pick or derive another);
* an empty string is null for every type but ``text``; a trait without a value is absent;
* the default traits ``service`` (publisher_id), ``tenant_id`` and ``request_id`` are on every
  event unless a definition redefines them; ``message_id`` is the event's own field;
* a notification no definition takes gets the default traits only, or is dropped (``None``) when
  ``allow_dropping`` (Ceilometer's ``allow_dropping_of_notifications``) is set.

A bad file (unknown key or plugin, bad JSONPath or type) is refused at load with an
``EventDefinitionError`` naming the file, the key path and the value.  A notification whose trait
value cannot be had in its type (``int`` of ``'abc'``) raises ``EventConversionError``: the caller
dead-letters it with that reason.  Unlike Ceilometer, text values are not cut at 255 characters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from jsonpath_ng import JSONPath
from jsonpath_ng.exceptions import JSONPathError
from jsonpath_ng.ext import parse as parse_path
from jsonpath_ng.jsonpath import Child, Fields

from ratebeam.transforms.events.event_types import EventTypes, remembered
from ratebeam.transforms.events.located import LocatedError, at, mapping, texts
from ratebeam.transforms.events.model import Event, Notification, TraitValue, parse_instant
from ratebeam.transforms.events.plugins import PLUGINS, TraitPlugin, Where

TRAIT_TYPES = ("text", "int", "float", "datetime")
#: Added to every event unless its definition redefines them (seed 002, *Definitions file format*).
DEFAULT_TRAITS: dict[str, Any] = {
    "service": {"fields": "publisher_id"},
    "tenant_id": {"fields": ["payload.tenant_id", "payload.project_id", "ctxt.project_id", "ctxt.tenant_id",
                             "ctxt.tenant"]},
    "request_id": {"fields": ["ctxt.request_id"]},
}


class EventDefinitionError(LocatedError):
    """The definitions file is wrong: ``file: key path: what: value``."""


class EventConversionError(ValueError):
    """A notification's trait value cannot be had in its type: the notification is dead-lettered."""


@dataclass(frozen=True)
class TraitDefinition:
    """How one trait's value is read: its paths (text, compiled), its type and plugin.

    ``keys``: for each path that is a plain chain of field names (``payload.a.'b.c'``, most of
    them), those names — read by walking the mappings, which gives what the JSONPath would and is
    an order of magnitude faster (conversion was mostly ``find``); ``None`` for the others.
    """

    name: str
    type: str
    paths: tuple[tuple[str, JSONPath], ...]
    plugin: TraitPlugin | None
    keys: tuple[tuple[str, ...] | None, ...]
    #: ``keys`` when every path is plain and there is no plugin (most traits): read by :func:`_first_plain`
    _plain: tuple[tuple[str, ...], ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.plugin is None and all(k is not None for k in self.keys):
            object.__setattr__(self, "_plain", cast(tuple[tuple[str, ...], ...], self.keys))

    def value(self, body: Mapping[str, Any]) -> TraitValue:
        """The trait's value in ``body`` (``None``: absent); raises ``ValueError`` for a bad value."""
        if self._plain is not None:
            raw = _first_plain(body, self._plain)
        elif self.plugin is None:  # the first non-null match of the paths, in order
            raw = None
            for (_, path), keys in zip(self.paths, self.keys, strict=True):
                raw = _get(body, keys) if keys is not None else next(
                    (m.value for m in path.find(body) if m.value is not None), None)
                if raw is not None:
                    break
        else:  # plugins see each match's path too (a plain path's match is at the path's own text)
            matches = []
            for (_, path), keys in zip(self.paths, self.keys, strict=True):
                if keys is None:
                    matches += [(str(m.full_path), m.value) for m in path.find(body) if m.value is not None]
                elif (found := _get(body, keys)) is not None:
                    matches.append((str(path), found))
            raw = next((v for v in self.plugin(matches) if v is not None), None)
        if raw is None or (raw == "" and self.type != "text"):
            return None
        return _typed(raw, self.type)


def _first_plain(body: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> Any:
    """The first non-null value at one of the plain ``paths`` (each read by :func:`_get`)."""
    for keys in paths:
        if (value := _get(body, keys)) is not None:
            return value
    return None


def _get(body: Any, keys: tuple[str, ...]) -> Any:
    """The value at ``keys`` (``None`` when a step is not a mapping holding the next key)."""
    for key in keys:
        if not (type(body) is dict or isinstance(body, Mapping)) or key not in body:  # dict first: the JSON case, fast
            return None
        body = body[key]
    return body


def _plain_keys(path: JSONPath) -> tuple[str, ...] | None:
    """The field names of a path made only of single named fields (``a.b.c``), else ``None``."""
    if isinstance(path, Fields):
        return (path.fields[0],) if len(path.fields) == 1 and path.fields[0] != "*" else None
    if isinstance(path, Child):
        left, right = _plain_keys(path.left), _plain_keys(path.right)
        return None if left is None or right is None else left + right
    return None


def _typed(raw: Any, kind: str) -> TraitValue:
    """``raw`` as a value of trait type ``kind`` (``ValueError`` when it is not one)."""
    if kind == "text":
        if type(raw) is str:
            return raw
        return json.dumps(raw, sort_keys=True, default=str) if isinstance(raw, dict | list) else str(raw)
    if kind == "datetime":
        return parse_instant(raw)
    if isinstance(raw, dict | list) or (isinstance(raw, float) and not math.isfinite(raw)):
        raise ValueError(f"not a {kind}: {raw!r}")
    if kind == "float":
        return float(raw)
    if isinstance(raw, float):
        if not raw.is_integer():
            raise ValueError(f"not an int: {raw!r}")
        return int(raw)
    return int(raw.strip()) if isinstance(raw, str) else int(raw)


@dataclass(frozen=True)
class EventDefinition:
    """One entry of the file: which event types it takes and the traits it reads (defaults included)."""

    types: EventTypes
    traits: tuple[TraitDefinition, ...]


@dataclass(frozen=True)
class EventDefinitions:
    """The whole file, in scanning order (last entry first), and the dropping policy."""

    definitions: tuple[EventDefinition, ...]
    fallback: EventDefinition
    allow_dropping: bool = False
    #: event type → its definition, found once per type (the scan matches every definition's globs)
    _found: dict[str, EventDefinition | None] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_yaml_data(cls, data: Any, source: str, *, allow_dropping: bool = False) -> EventDefinitions:
        """The definitions of a loaded YAML document (``None``, an empty file, is no definition).

        ``source`` names the file in error messages.  Raises ``EventDefinitionError``.
        """
        items = [] if data is None else data
        if not isinstance(items, list):
            raise EventDefinitionError(source, "", "expected a list of event definitions", data)
        defaults = _traits(DEFAULT_TRAITS, source, "(default traits)")
        parsed = [_definition(item, source, at("", n), defaults) for n, item in enumerate(items)]
        return cls(tuple(reversed(parsed)), EventDefinition(EventTypes(("*",), ()), tuple(defaults.values())),
                   allow_dropping)

    def reading_only(self, names: Collection[str]) -> EventDefinitions:
        """These definitions with only the traits ``names`` (the ones a job's triggers and pipelines read).

        Why: a notification carries 10 to 20 traits and a job reads a few; reading, typing, pickling and
        keeping the others in state was most of the conversion's time and of each event's size.  A bad
        value in a trait left out is then not read, so it no longer makes the notification a dead letter.
        """
        def kept(definition: EventDefinition) -> EventDefinition:
            return EventDefinition(definition.types, tuple(t for t in definition.traits if t.name in names))

        return EventDefinitions(tuple(kept(d) for d in self.definitions), kept(self.fallback), self.allow_dropping)

    def definition_for(self, event_type: str) -> EventDefinition | None:
        """The definition that converts ``event_type`` (``None``: dropped)."""
        if event_type in self._found:
            return self._found[event_type]
        found = next((d for d in self.definitions if d.types(event_type)), None)
        if found is None and not self.allow_dropping:
            found = self.fallback
        if len(self._found) < remembered:
            self._found[event_type] = found
        return found

    def convert(self, n: Notification) -> Event | None:
        """The event of ``n`` (``None``: no definition takes it and dropping is allowed).

        Raises ``EventConversionError`` naming the trait and the value it could not convert.
        """
        definition = self.definition_for(n.event_type)
        if definition is None:
            return None
        body = n.body()
        traits: dict[str, TraitValue] = {}
        for trait in definition.traits:
            try:
                value = trait.value(body)
            except (ValueError, TypeError, OverflowError, RecursionError) as exc:
                raise EventConversionError(
                    f"{n.event_type} {n.message_id}: trait {trait.name} ({trait.type}): {exc}") from None
            if value is not None:
                traits[trait.name] = value
        return Event(n.message_id, n.event_type, _utc(n.timestamp), traits)


def _utc(when: datetime) -> datetime:
    if when.tzinfo is None:
        raise EventConversionError(f"notification timestamp is naive: {when.isoformat()}")
    return parse_instant(when)


def _definition(item: Any, source: str, path: str, defaults: dict[str, TraitDefinition]) -> EventDefinition:
    entry = mapping(item, EventDefinitionError, source, path, ("event_type", "traits"), ("event_type", "traits"))
    types = EventTypes.parse(texts(entry["event_type"], EventDefinitionError, source, at(path, "event_type")))
    traits = defaults | _traits(entry["traits"], source, at(path, "traits"))
    return EventDefinition(types, tuple(traits.values()))


def _traits(data: Any, source: str, path: str) -> dict[str, TraitDefinition]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EventDefinitionError(source, path, "expected a mapping of trait names to trait definitions", data)
    out = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not name:
            raise EventDefinitionError(source, path, "trait names must be non-empty strings", name)
        out[name] = _trait(name, spec, source, at(path, name))
    return out


def _trait(name: str, spec: Any, source: str, path: str) -> TraitDefinition:
    if isinstance(spec, str | list):
        spec = {"fields": spec}
    entry = mapping(spec, EventDefinitionError, source, path, ("type", "fields", "plugin"), ("fields",))
    kind = entry.get("type", "text")
    if kind not in TRAIT_TYPES:
        raise EventDefinitionError(source, at(path, "type"), f"unknown trait type (expected one of: "
                                   f"{', '.join(TRAIT_TYPES)})", kind)
    fields_path = at(path, "fields")
    paths = tuple((text, _compiled(text, source, at(fields_path, n) if isinstance(entry["fields"], list)
                                   else fields_path))
                  for n, text in enumerate(texts(entry["fields"], EventDefinitionError, source, fields_path)))
    plugin = None if "plugin" not in entry else _plugin(entry["plugin"], source, at(path, "plugin"))
    return TraitDefinition(name, kind, paths, plugin, tuple(_plain_keys(compiled) for _, compiled in paths))


def _compiled(text: str, source: str, path: str) -> JSONPath:
    try:
        return parse_path(text)
    except (JSONPathError, ValueError, TypeError, AttributeError) as exc:
        raise EventDefinitionError(source, path, f"not a JSONPath ({exc})", text) from None


def _plugin(spec: Any, source: str, path: str) -> TraitPlugin:
    entry = {"name": spec} if isinstance(spec, str) else spec
    entry = mapping(entry, EventDefinitionError, source, path, ("name", "parameters"), ("name",))
    name = entry["name"]
    name_path = path if isinstance(spec, str) else at(path, "name")
    if name not in PLUGINS:
        raise EventDefinitionError(source, name_path, f"unknown plugin (expected one of: {', '.join(sorted(PLUGINS))})",
                                   name)
    params = entry.get("parameters")
    return PLUGINS[name]({} if params is None else params, Where(source, at(path, "parameters"), EventDefinitionError))
