"""Rules JSON (interchange.md): the pydantic model of the file, its ``RuleSet`` and the way back.

Reading validates like CloudKitty's API and database do: costs and levels must fit CloudKitty's
NUMERIC columns, a service mapping has no value and a field mapping needs one, and the uniqueness
rules are ``transforms.hashmap_constraints``' — the very checks of ``hashmap ... create|update`` —
so a file ``rules export`` wrote is always taken back.  Writing is exact: reading what ``write_rules`` wrote gives an equal ``RuleSet``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)

from ratebeam.connectors.config_model import NOTHING, ExactDecimal, Instant, Invalid, says
from ratebeam.pipelines.interchange.document import Document, Name, json_list, load_json, read_text
from ratebeam.pipelines.validation import validate
from ratebeam.transforms.hashmap_constraints import (
    MappingSlot,
    ThresholdSlot,
    end_before_start,
    mapping_clash,
    threshold_clash,
)
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule

Rule = MappingRule | ThresholdRule
#: Where a rule is in the file: pydantic's location and the path the user reads.
Located = tuple[tuple[Any, ...], str, Rule]


def _decimals(number: Decimal) -> int:
    """Digits after the point once trailing zeros are dropped, for any exponent (no context)."""
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: ExactDecimal refuses the others
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return 0 if trailing == len(digits) else max(0, -(exponent + trailing))


def _numeric(integers: int, decimals: int) -> WrapValidator:
    """A decimal that fits CloudKitty's column NUMERIC(integers + decimals, decimals) (`cloudkitty/utils/__init__.py:250-292`)."""

    def check(value: Any, handler: Callable[[Any], Decimal]) -> Decimal:
        number = handler(value)
        if number.copy_abs() >= Decimal(10) ** integers or _decimals(number) > decimals:
            raise Invalid(f"out of CloudKitty's NUMERIC({integers + decimals},{decimals}) range", str(value))
        return number

    return WrapValidator(check)


Cost = Annotated[ExactDecimal, _numeric(12, 28)]
Level = Annotated[ExactDecimal, _numeric(12, 8)]
MapType = Annotated[Literal["flat", "rate"], says("must be 'flat' or 'rate'")]


def _no_value(value: Any) -> None:
    if value is not None:
        raise Invalid("a service mapping has no value")


def _needs_value(value: Any) -> Any:
    if value is None or value == "":
        raise Invalid("a field mapping needs a non-empty value", NOTHING)
    return value


def _unique(what: str, key: Callable[[Any], str] | None = None) -> AfterValidator:
    """Refuse a list whose items (or their ``name``) repeat, at the second one."""

    def check(items: tuple[Any, ...]) -> tuple[Any, ...]:
        seen: set[str] = set()
        for i, item in enumerate(items):
            name = item if key is None else key(item)
            if name in seen:
                raise Invalid(what, name, (i,) if key is None else (i, "name"))
            seen.add(name)
        return items

    return AfterValidator(check)


class _Rule(Document):
    type: MapType = "flat"
    cost: Cost
    group: Name | None = None
    tenant_id: Name | None = None


class _Mapping(_Rule):
    start: Instant | None = None
    end: Instant | None = None

    @field_validator("end")
    @classmethod
    def _after_start(cls, end: datetime | None, info: ValidationInfo) -> datetime | None:
        if end_before_start(info.data.get("start"), end):  # CloudKitty's refusal, shared with `hashmap`
            raise Invalid("must not be before start")
        return end


class ServiceMapping(_Mapping):
    """A mapping of a service: a flat or rate cost for every point of the service (no value)."""

    value: Annotated[None, BeforeValidator(_no_value)] = None


class FieldMapping(_Mapping):
    """A mapping of a field: the cost of points whose field has ``value``."""

    value: Annotated[Name, BeforeValidator(_needs_value)] = Field(default=None, validate_default=True)


class Threshold(_Rule):
    """A threshold: the cost from ``level`` of the compared quantity or field value on."""

    level: Level = Decimal(0)


class FieldRules(Document):
    """One field of a service and its mappings and thresholds."""

    name: Name
    mappings: json_list(FieldMapping) = ()
    thresholds: json_list(Threshold) = ()


class ServiceRules(Document):
    """One service (a rating type) with its own rules and its fields."""

    name: Name
    mappings: json_list(ServiceMapping) = ()
    thresholds: json_list(Threshold) = ()
    fields: Annotated[json_list(FieldRules), _unique("duplicate field of this service", lambda f: f.name)] = ()


class RulesFile(Document):
    """A whole rules JSON document, checked against `cloudkitty/rating/hash/db/sqlalchemy/api.py:311-405` once every rule is valid."""

    groups: Annotated[json_list(Name), _unique("duplicate group")] = ()
    services: Annotated[json_list(ServiceRules), _unique("duplicate service", lambda s: s.name)] = ()

    @model_validator(mode="after")
    def _spec_4_1(self, info: ValidationInfo) -> RulesFile:
        located = list(self.located())
        _check_overlaps([r for r in located if isinstance(r[2], MappingRule)])
        _check_levels([r for r in located if isinstance(r[2], ThresholdRule)])
        known = (info.context or {}).get("known_groups")
        if known is not None:
            _check_groups(located, {*self.groups, *known})
        return self

    def located(self) -> Iterator[Located]:
        """Every rule with its location, in file order (service rules, then each field's)."""
        for i, service in enumerate(self.services):
            yield from _rules_of(service, ("services", i), service.name, None)
            for j, field in enumerate(service.fields):
                yield from _rules_of(field, ("services", i, "fields", j), service.name, field.name)

    def rule_set(self) -> RuleSet:
        """The document as the kernel's ``RuleSet`` (groups declared or used, rules in file order)."""
        rules = [rule for _, _, rule in self.located()]
        used = [rule.group for rule in rules if rule.group is not None]
        return RuleSet(
            services=tuple(s.name for s in self.services),
            fields=tuple((s.name, f.name) for s in self.services for f in s.fields),
            mappings=tuple(r for r in rules if isinstance(r, MappingRule)),
            thresholds=tuple(r for r in rules if isinstance(r, ThresholdRule)),
            groups=tuple(dict.fromkeys([*self.groups, *used])),
        )


def _path(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _rules_of(parent: ServiceRules | FieldRules, at: tuple[Any, ...], service: str,
              field: str | None) -> Iterator[Located]:
    for k, m in enumerate(parent.mappings):
        loc = (*at, "mappings", k)
        path = _path(loc)  # a file rule's id (lineage names it): its place in the file
        yield loc, path, MappingRule(service, field, m.value, m.type, m.cost, m.group, m.tenant_id,
                                     m.start, m.end, id=path)
    for k, t in enumerate(parent.thresholds):
        loc = (*at, "thresholds", k)
        path = _path(loc)
        yield loc, path, ThresholdRule(service, field, t.level, t.type, t.cost, t.group, t.tenant_id, id=path)


def _check_overlaps(mappings: list[Located]) -> None:
    """CloudKitty's duplicate check of each mapping against those before it (``transforms.hashmap_constraints``)."""
    slots = [MappingSlot((r.service, r.field), r.value, r.tenant_id, r.group, r.start, r.end, path)
             for _, path, r in mappings if isinstance(r, MappingRule)]
    for index, (loc, _, _) in enumerate(mappings):
        other = mapping_clash(slots[:index + 1], index)
        if other is not None:
            raise Invalid(f"clashes with {other.name}: same parent, value, tenant and group, and a validity "
                          "CloudKitty's duplicate check finds overlapping", NOTHING, loc)


def _check_groups(located: list[Located], known: set[str]) -> None:
    """Refuse a rule whose group is neither declared nor existing.

    A typo would silently make a new group, and groups decide how costs combine.
    """
    for loc, _, rule in located:
        if rule.group is not None and rule.group not in known:
            raise Invalid("group not declared in the file's 'groups' nor existing in the database "
                          "(a new group changes how costs combine: declare it in 'groups')", rule.group,
                          (*loc, "group"))


def _check_levels(thresholds: list[Located]) -> None:
    """CloudKitty's unique constraints: one level per parent and tenant, global thresholds exempt."""
    slots = [ThresholdSlot((r.service, r.field), r.level, r.tenant_id, path)
             for _, path, r in thresholds if isinstance(r, ThresholdRule)]
    for index, (loc, _, rule) in enumerate(thresholds):
        other = threshold_clash(slots[:index + 1], index)
        if other is not None:
            raise Invalid(f"same level as {other.name} (same parent and tenant)", str(rule.level), (*loc, "level"))


def read_rules(path: str | Path, known_groups: Iterable[str] | None = None) -> RuleSet:
    """Read and validate a rules JSON file (interchange.md); ``InputError`` names what is wrong.

    With ``known_groups`` (the groups that exist already), a rule naming a group neither declared in
    the file's ``groups`` nor known is refused; without, used groups are added after declared ones.
    """
    return parse_rules(read_text(path), str(path), known_groups)


def parse_rules(text: str, source: str, known_groups: Iterable[str] | None = None) -> RuleSet:
    """Parse rules JSON text; ``source`` names the file in errors (``known_groups``: ``read_rules``)."""
    context = None if known_groups is None else {"known_groups": set(known_groups)}
    return validate(RulesFile, load_json(text, source, exact_numbers=True), source, context, top="").rule_set()


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def rules_to_json(rules: RuleSet) -> dict[str, Any]:
    """The rules JSON document of a rule set (every key written, decimals as exact strings).

    Rules are nested per service, in ``rules.services`` order, keeping their order within a service
    (the only order that matters: fields of one service break threshold ties in ``rules.fields``
    order); a rule set read from a file comes back identical.
    """
    def mapping(rule: MappingRule) -> dict[str, Any]:
        out: dict[str, Any] = {} if rule.field is None else {"value": rule.value}
        return out | {
            "type": rule.type, "cost": str(rule.cost), "group": rule.group, "tenant_id": rule.tenant_id,
            "start": None if rule.start is None else _iso(rule.start),
            "end": None if rule.end is None else _iso(rule.end),
        }

    def threshold(rule: ThresholdRule) -> dict[str, Any]:
        return {"level": str(rule.level), "type": rule.type, "cost": str(rule.cost), "group": rule.group,
                "tenant_id": rule.tenant_id}

    known = {(s, None) for s in rules.services} | set(rules.fields)
    for rule in (*rules.mappings, *rules.thresholds):
        if (rule.service, rule.field) not in known:
            raise ValueError(f"rule on undeclared service/field {rule.service!r}/{rule.field!r}: {rule}")
    services = []
    for name in rules.services:
        service: dict[str, Any] = {"name": name}
        service["mappings"] = [mapping(m) for m in rules.mappings if m.service == name and m.field is None]
        service["thresholds"] = [threshold(t) for t in rules.thresholds if t.service == name and t.field is None]
        service["fields"] = [
            {"name": field,
             "mappings": [mapping(m) for m in rules.mappings if m.service == name and m.field == field],
             "thresholds": [threshold(t) for t in rules.thresholds if t.service == name and t.field == field]}
            for svc, field in rules.fields if svc == name
        ]
        services.append(service)
    return {"groups": list(rules.groups), "services": services}


def write_rules(rules: RuleSet, out: TextIO) -> None:
    """Write a rule set as rules JSON (``ratebeam rules export``)."""
    json.dump(rules_to_json(rules), out, indent=2)
    out.write("\n")
