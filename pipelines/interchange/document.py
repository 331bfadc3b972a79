"""What the three interchange files share: reading JSON strictly and the pieces of their models.

JSON is parsed before any model sees it, refusing what ``json`` silently accepts (a duplicate key
keeps the last value, ``NaN`` is not JSON), so a mistake is reported at its line and column.  The
models then validate the parsed document through ``ratebeam.pipelines.validation``, the one
adapter from pydantic to ``InputError``; their messages (``must be a list, not an object``,
``missing``) are the files' own wording, older than the configuration models'.
"""

from __future__ import annotations

import decimal
import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any

from annotated_types import MinLen
from pydantic import BeforeValidator, Strict, model_validator

from ratebeam.connectors.config_model import NOTHING, ConfigModel, Invalid, kind, known_keys, says
from ratebeam.pipelines.errors import InputError
from ratebeam.transforms.long_integers import find_constant, find_lone_surrogate, find_long_integer

#: Enough digits for any sum of NUMERIC(40,28) prices: money is never rounded by the context.
WIDE = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_EVEN)

#: A name, a label value, a tenant: a non-empty string.
Name = Annotated[str, Strict(), MinLen(1), says("must be a non-empty string")]


class Document(ConfigModel):
    """An object of an interchange file: unknown keys refused, then missing required keys."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise Invalid(f"must be an object, not {kind(data)}", NOTHING)
        known_keys(data, cls.model_fields, expected="expected one of ")
        for name in _required(cls):
            if name not in data:
                raise Invalid("missing", NOTHING, (name,))
        return data


@functools.cache
def _required(model: type[Document]) -> tuple[str, ...]:
    return tuple(name for name, field in model.model_fields.items() if field.is_required())


def json_list(item: Any) -> Any:
    """A JSON list of ``item`` as a tuple; ``null`` is the empty list."""

    def shape(value: Any) -> tuple[Any, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise Invalid(f"must be a list, not {kind(value)}", NOTHING)
        return tuple(value)

    return Annotated[tuple[item, ...], BeforeValidator(shape)]


class _JsonValueError(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _JsonValueError(f"{name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(text: str, source: str, *, exact_numbers: bool, line: int = 1) -> Any:
    """One JSON document; ``exact_numbers`` reads numbers with a point as ``Decimal`` (their text).

    ``text`` begins on line ``line`` of the file (a JSONL line): errors name the file's lines.
    Also refused, with the file named, what ``json`` lets escape as Python errors or lets through
    although no later stage can hold it: nesting deeper than its recursive decoder follows, an
    integer over Python's 4,300-digit conversion limit (named by line, column and key path), a
    lone surrogate escape (a ``u`` escape of D800-DFFF alone, not Unicode text: Polars and the
    output could not encode it).
    """
    whole = f"line {line}" if line > 1 else ""
    try:
        document = json.loads(text, parse_float=decimal.Decimal if exact_numbers else float,
                              parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise InputError(source, f"line {err.lineno + line - 1} column {err.colno}", f"invalid JSON: {err.msg}") from None
    except _JsonValueError as err:
        found = find_constant(text) if "not allowed" in str(err) else None
        raise InputError(source, _where(found, line, whole), f"invalid JSON: {err}") from None
    except RecursionError:
        raise InputError(source, whole, "invalid JSON: nested too deeply") from None
    except ValueError:  # int() of a number over sys.get_int_max_str_digits() digits
        where = _where(find_long_integer(text), line, whole)
        raise InputError(source, where, f"a number has more than {sys.get_int_max_str_digits()} digits") from None
    if "\\u" in text and _has_surrogate(document):
        raise InputError(source, _where(find_lone_surrogate(text), line, whole), "invalid JSON: a string holds a lone surrogate escape (not Unicode text)")
    return document


def _where(found: tuple[int, int, str] | None, line: int, whole: str) -> str:
    """Where a refusal points: the line, column and key ``found`` in ``text`` (starting on ``line``)."""
    if found is None:
        return whole
    return f"line {found[0] + line - 1} column {found[1]}" + (f": {found[2]}" if found[2] else "")


def _has_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (or a key) cannot be encoded as UTF-8 (a lone surrogate)."""
    stack = [value]
    while stack:  # a loop, not recursion: the document may be as deep as json allowed
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def read_text(path: str | Path) -> str:
    """The text of a file, or the ``InputError`` saying why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(str(path), "", f"cannot read: {getattr(err, 'strerror', None) or err}") from None
