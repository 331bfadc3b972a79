"""Building blocks of every typed configuration: the base model, located errors and checked types.

Each connector owns its pydantic model (``connectors/<kind>s/<name>/config.py``) and ratebeam's own
files (``ratebeam.yaml``, ``metrics.yml``, runner configs) use the same pieces, so a mistake gets
the same one-line message whatever the file: a type here carries its message (``expected an
integer >= 1``) and a check raises ``Invalid`` (a ``ValueError``, which pydantic collects with the
key path).  ``ratebeam.pipelines.validation`` turns the first collected error into an
``InputError`` naming file, key path and value.  This module must not import ``ratebeam.pipelines``
(connectors never do): the context a model needs (the directory relative paths are resolved
against) comes through pydantic's validation context.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import fsspec
from annotated_types import Ge, MinLen
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    model_validator,
)


@dataclasses.dataclass(frozen=True)
class Shown:
    """What a type accepts, in words, for the configuration reference (``tools/gen_config_doc.py``).

    Annotated metadata pydantic ignores: the checks themselves are the validators beside it, so the
    reference says what the code checks without a second copy of the bounds.
    """

    text: str


#: ``Field(json_schema_extra=DERIVED)``: a field computed while loading, not a key of the file.
DERIVED: dict[str, Any] = {"derived": True}


def shown_type(text: str) -> dict[str, Any]:
    """``Field(json_schema_extra=...)`` of a field written in the file as ``text`` (a path, a mapping)."""
    return {"type": text}


#: ``Invalid(value=INPUT)``: show the value the user wrote at the error's key (the default).
INPUT: Any = object()
#: ``Invalid(value=NOTHING)``: the message says it all (a missing key, two keys that clash).
NOTHING: Any = object()


class Invalid(ValueError):
    """A refused value: ``message``, the value to show and ``at``, a key path below the checked field."""

    def __init__(self, message: str, value: object = INPUT, at: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.message, self.value, self.at = message, value, at


class ConfigModel(BaseModel):
    """Frozen (picklable, shipped to Beam workers), unknown keys refused, no type coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return known_keys(data, cls.model_fields)


def known_keys(data: Any, allowed: Collection[str], expected: str = "expected one of: ") -> Any:
    """``data`` if it is a mapping whose keys are all in ``allowed`` (checked before any value).

    ``expected`` introduces the list of allowed keys in the message (the interchange files, older
    than the configuration models, say ``expected one of a, b``).
    """
    if isinstance(data, BaseModel):
        return data
    if not isinstance(data, dict):
        raise Invalid("expected a mapping")
    for name in data:
        if not isinstance(name, str):
            raise Invalid("keys must be strings", name)
        if name not in allowed:
            raise Invalid(f"unknown key ({expected}{', '.join(sorted(allowed))})", NOTHING, (name,))
    return data


def says(message: str) -> WrapValidator:
    """Validate with the annotated type's own (strict) rules but refuse with ``message``."""

    def check(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise Invalid(message) from None

    return WrapValidator(check)


NonEmptyStr = Annotated[str, Strict(), MinLen(1), says("expected a non-empty string"), Shown("non-empty")]
Text = Annotated[str, Strict(), says("expected a string")]
Boolean = Annotated[bool, Strict(), says("expected true or false")]


def kind(value: Any) -> str:
    """What ``value`` is, in JSON's words, for ``must be X, not <kind>`` messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return "a string" if isinstance(value, str) else "a number"


_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _exact_decimal(value: Any) -> Decimal:
    """The number the user wrote: decimal text and ints exactly, a float as ``Decimal(str(x))``.

    Text must be a plain number (no ``NaN``, ``1_000``, spaces or fractions: SQL and CloudKitty's
    API would read those differently or not at all); a ``Decimal`` is what ``json.loads(...,
    parse_float=Decimal)`` gives for a JSON number, kept as written.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise Invalid(f"must be a decimal string or a number, not {kind(value)}", NOTHING)
    if isinstance(value, str):
        if not _DECIMAL_TEXT.fullmatch(value):
            raise Invalid("not a decimal")
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid("not a finite number")
        return Decimal(str(value))
    if not Decimal(value).is_finite():
        raise Invalid("not a finite number")
    return Decimal(value)


def _instant(value: Any) -> datetime:
    """An ISO-8601 text as an aware UTC datetime; a naive one is read as UTC."""
    if not isinstance(value, str):
        raise Invalid(f"must be an ISO-8601 datetime string, not {kind(value)}", NOTHING)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise Invalid("not an ISO-8601 datetime") from None
    try:
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is in year 10000 once in UTC
        raise Invalid("outside the years 1-9999 once in UTC") from None


#: An exact ``Decimal`` from decimal text or a number (money and quantities never pass a float).
ExactDecimal = Annotated[Decimal, PlainValidator(_exact_decimal)]
#: A tz-aware UTC ``datetime`` from ISO-8601 text (naive means UTC).
Instant = Annotated[datetime, PlainValidator(_instant)]


# ``integer``, ``choice`` and ``seconds`` build their type when the model is defined, so a type
# checker cannot read a field annotated with them: such fields carry ``# type: ignore[valid-type]``.


def integer(minimum: int, maximum: int | None = None) -> Any:
    """An integer >= ``minimum`` (and <= ``maximum``); a YAML boolean or ``'3600'`` is not one.

    Give every number the code turns into a duration, a date or a count a ``maximum`` it can hold:
    an unbounded one is accepted here and overflows later, in the middle of a run.
    """
    checked = Annotated[int, Strict(), Ge(minimum), says(f"expected an integer >= {minimum}")]
    if maximum is None:
        return Annotated[checked, Shown(f">= {minimum}")]

    def at_most(value: int) -> int:
        if value > maximum:
            raise Invalid(f"expected an integer <= {maximum}")
        return value

    return Annotated[checked, AfterValidator(at_most), Shown(f"{minimum} to {maximum}")]


def choice(choices: Collection[str], expected: str | None = None) -> Any:
    """One of ``choices``; ``expected`` describes them in the error (default: sorted)."""
    shown = expected or ", ".join(sorted(choices))
    return Annotated[Literal[tuple(choices)], says(f"expected one of {shown}"), Shown(f"one of {shown}")]


def seconds(low: float, high: float, open_low: bool = True) -> Any:
    """A number of seconds in ``(low, high]`` (``[low, high]`` if not ``open_low``)."""
    shown = f"{'(' if open_low else '['}{low:g}, {high:g}]"

    def check(value: Any, handler: Any) -> float:
        try:
            number = handler(value)
        except ValidationError:
            number = None
        if number is None or not (low < number if open_low else low <= number) or number > high:
            raise Invalid(f"expected a number of seconds in {shown}")
        return float(number)

    return Annotated[float, Strict(), WrapValidator(check), Shown(f"seconds in {shown}")]


def _string_list(allow_empty: bool) -> Any:
    message = "expected a list of strings" if allow_empty else "expected a non-empty list of strings"

    def shape(value: Any) -> Any:
        if not isinstance(value, list | tuple) or (not allow_empty and not value):
            raise Invalid(message)
        return tuple(value)

    def unique(items: tuple[str, ...]) -> tuple[str, ...]:
        for i, item in enumerate(items):
            if item in items[:i]:
                raise Invalid("listed twice", item, (i,))
        return items

    return Annotated[tuple[NonEmptyStr, ...], BeforeValidator(shape), WrapValidator(lambda v, h: unique(h(v))),
                     Shown("unique" if allow_empty else "non-empty, unique")]


#: A list of unique non-empty strings, as a tuple.
StringList = _string_list(allow_empty=True)
NonEmptyStringList = _string_list(allow_empty=False)


def dataclass_from(cls: type[Any], source: object) -> Any:
    """A ``cls`` dataclass (a runtime connection) with each field read from ``source``'s attribute."""
    return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})


def base_dir(info: ValidationInfo) -> Path:
    """The directory relative paths are resolved against: the config file's (context ``base``)."""
    context = info.context or {}
    return Path(context.get("base") or Path.cwd())


def backend_names(models: tuple[type[BaseModel], ...]) -> tuple[str, ...]:
    """The ``backend`` literals of ``models``, in order."""
    return tuple(name for model in models for name in get_args(model.model_fields["backend"].annotation))


def sections(*models: type[BaseModel]) -> Any:
    """A ``{backend: <name>, ...}`` section: a discriminated union of ``models`` on ``backend``."""
    known = backend_names(models)

    def tag(data: Any) -> Any:
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise Invalid("expected a mapping with a 'backend' key")
        if "backend" not in data:
            raise Invalid("required key is missing", NOTHING, ("backend",))
        if not isinstance(data["backend"], str) or data["backend"] not in known:
            raise Invalid(f"expected one of {', '.join(known)}", data["backend"], ("backend",))
        return data

    return Annotated[Union[models], Field(discriminator="backend"), BeforeValidator(tag)]  # noqa: UP007


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(//)?")


def _location(text: str, info: ValidationInfo) -> str:
    """An fsspec URL (``s3://b/k``, ``simplecache::s3://b/k``) kept as is, or a path made absolute."""
    *chain, last = text.split("::")
    known = set(fsspec.available_protocols())
    for protocol in chain:
        if protocol not in known:
            raise Invalid(f"unknown fsspec protocol {protocol!r}")
    match = _SCHEME.match(last)
    if match is None:
        if chain:
            raise Invalid("not a URL")
        resolved = str(base_dir(info) / Path(last).expanduser())
        return resolved + "/" if last.endswith("/") else resolved
    if not match.group(2) or len(last) == match.end():
        raise Invalid("not a URL")
    if match.group(1).lower() not in known:
        raise Invalid(f"unknown URL scheme {match.group(1)!r}")
    return text


#: Where files are: an fsspec URL, or a path resolved against the config file's directory.
Location = Annotated[NonEmptyStr, AfterValidator(_location), Shown("a path (relative to the file) or an fsspec URL")]
