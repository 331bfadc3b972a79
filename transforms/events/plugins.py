"""Trait plugins (seed 002, *Trait plugins*): ``split``, ``bitfield``, ``timedelta``, behind a registry.

A plugin is built once per trait definition from its ``parameters`` (checked at load: an unknown
parameter or a wrong type refuses the file) and called with every non-null ``(path, value)`` the
trait's fields matched, in field order — even none.  It returns candidate values; the trait takes
the first that is not ``None`` (no value: the trait is absent).  New plugins are one entry in
``PLUGINS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonpath_ng.exceptions import JSONPathError
from jsonpath_ng.ext import parse as parse_path

from ratebeam.transforms.events.located import LocatedError, at, mapping
from ratebeam.transforms.events.model import parse_instant

#: (path of the matched field, its value), as the plugin receives them.
Match = tuple[str, Any]
TraitPlugin = Callable[[list[Match]], list[Any]]


@dataclass(frozen=True)
class Where:
    """Where a plugin's parameters are in the file, for its error messages."""

    source: str
    path: str
    error: type[LocatedError]

    def refuse(self, key: str, message: str, value: object) -> LocatedError:
        """The error for parameter ``key`` (``value`` shown)."""
        return self.error(self.source, at(self.path, key), message, value)


def _integer(params: dict[str, Any], key: str, default: int | None, where: Where, minimum: int | None = None
             ) -> int | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise where.refuse(key, f"expected an integer{bound}", value)
    return value


@dataclass(frozen=True)
class Split:
    """``segment`` of the value split on ``separator`` at most ``max_split`` times (``host`` of ``compute.host``)."""

    separator: str
    segment: int
    max_split: int | None

    def __call__(self, matches: list[Match]) -> list[Any]:
        """One candidate per match: its segment, or ``None`` when the value has too few."""
        out: list[Any] = []
        for _, value in matches:
            parts = str(value).split(self.separator, -1 if self.max_split is None else self.max_split)
            out.append(parts[self.segment] if -len(parts) <= self.segment < len(parts) else None)
        return out


def _split(params: dict[str, Any], where: Where) -> TraitPlugin:
    mapping(params, where.error, where.source, where.path, ("separator", "segment", "max_split"))
    separator = params.get("separator", ".")
    if not isinstance(separator, str) or not separator:
        raise where.refuse("separator", "expected a non-empty string", separator)
    segment = _integer(params, "segment", 0, where)
    assert segment is not None
    return Split(separator, segment, _integer(params, "max_split", None, where, minimum=0))


@dataclass(frozen=True)
class Flag:
    """Set ``bit`` when the field at ``path`` matched (and, with ``value``, equals it)."""

    path: str
    bit: int
    value: Any
    has_value: bool


@dataclass(frozen=True)
class Bitfield:
    """An int whose bits say which fields were present or had a given value, over ``initial``."""

    initial: int
    flags: tuple[Flag, ...]

    def __call__(self, matches: list[Match]) -> list[Any]:
        """The one bitfield of all matches."""
        found = dict(matches)
        bits = self.initial
        for flag in self.flags:
            if flag.path in found and (not flag.has_value or found[flag.path] == flag.value):
                bits |= 1 << flag.bit
        return [bits]


def _bitfield(params: dict[str, Any], where: Where) -> TraitPlugin:
    mapping(params, where.error, where.source, where.path, ("initial_bitfield", "flags"))
    initial = _integer(params, "initial_bitfield", 0, where, minimum=0)
    assert initial is not None
    raw = params.get("flags", [])
    if not isinstance(raw, list):
        raise where.refuse("flags", "expected a list", raw)
    flags = []
    for n, item in enumerate(raw):
        flag_where = Where(where.source, at(at(where.path, "flags"), n), where.error)
        mapping(item, where.error, where.source, flag_where.path, ("path", "bit", "value"), ("path", "bit"))
        bit = _integer(item, "bit", None, flag_where, minimum=0)
        assert bit is not None
        flags.append(Flag(normal_path(item["path"], flag_where, "path"), bit, item.get("value"), "value" in item))
    return Bitfield(initial, tuple(flags))


def normal_path(text: object, where: Where, key: str) -> str:
    """A JSONPath's canonical text (what matches report as their path): ``payload[a]`` → ``payload.a``."""
    if not isinstance(text, str) or not text:
        raise where.refuse(key, "expected a JSONPath string", text)
    try:
        return str(parse_path(text))
    except (JSONPathError, ValueError, TypeError) as exc:
        raise where.refuse(key, f"not a JSONPath ({exc})", text) from None


def _timedelta_between(matches: list[Match]) -> list[Any]:
    """Seconds between the two datetime fields matched (none unless exactly two, both datetimes)."""
    if len(matches) != 2:
        return []
    try:
        first, second = (parse_instant(value) for _, value in matches)
    except ValueError:
        return []
    return [abs((second - first).total_seconds())]


def _timedelta(params: dict[str, Any], where: Where) -> TraitPlugin:
    mapping(params, where.error, where.source, where.path, ())
    return _timedelta_between


#: name → factory(parameters, where) of the plugin a trait definition names.
PLUGINS: dict[str, Callable[[dict[str, Any], Where], TraitPlugin]] = {
    "split": _split,
    "bitfield": _bitfield,
    "timedelta": _timedelta,
}
