"""Where a definitions or triggers file is wrong: one line naming the file, the key path and the value.

Why here and not pydantic: ``transforms`` may not import ``connectors.config_model`` or
``pipelines.validation``, and these files are mostly free text in small grammars (globs, JSONPath,
time expressions), checked by hand anyway.  The message has the shape of ``pipelines.errors.InputError``
(``file: key: what: 'value'``), which the loaders in ``pipelines`` re-raise as one.
"""

from __future__ import annotations

import reprlib
from collections.abc import Collection
from typing import Any

#: ``LocatedError(value=NO_VALUE)``: the message says it all (a missing key).
NO_VALUE: Any = object()
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 200
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 6, 6


class LocatedError(ValueError):
    """``source: location: message[: value]`` — the file, the key path (``[2].traits.host.fields``), why."""

    def __init__(self, source: str, location: str, message: str, value: object = NO_VALUE) -> None:
        self.source, self.location, self.message = source, location or "(top level)", message
        self.has_value = value is not NO_VALUE
        self.value = None if value is NO_VALUE else value
        shown = f"{message}: {_REPR.repr(value)}" if self.has_value else message
        super().__init__(f"{source}: {self.location}: {shown}")


def at(path: str, key: object) -> str:
    """``path`` extended by a mapping key (``.key``) or a list index (``[i]``)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def mapping(value: Any, error: type[LocatedError], source: str, path: str,
            allowed: Collection[str], required: Collection[str] = ()) -> dict[str, Any]:
    """``value`` if it is a mapping with string keys, all in ``allowed``, ``required`` ones present."""
    if not isinstance(value, dict):
        raise error(source, path, "expected a mapping", value)
    for key in value:
        if not isinstance(key, str) or key not in allowed:
            expected = f"expected one of: {', '.join(sorted(allowed))}" if allowed else "no key is allowed here"
            raise error(source, at(path, str(key)), f"unknown key ({expected})")
    for key in required:
        if key not in value:
            raise error(source, at(path, key), "required key is missing")
    return value


def text(value: Any, error: type[LocatedError], source: str, path: str) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise error(source, path, "expected a non-empty string", value)
    return value


def texts(value: Any, error: type[LocatedError], source: str, path: str) -> tuple[str, ...]:
    """A string or a non-empty list of strings, as a tuple (YAML's one-element-list shorthand)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise error(source, path, "expected a string or a non-empty list of strings", value)
    return tuple(text(item, error, source, at(path, n)) for n, item in enumerate(items))
