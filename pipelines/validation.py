"""The one adapter from a pydantic validation error to ratebeam's one-line ``InputError``.

Models (``connectors.config_model`` and the models built on it) say *what* is wrong; this says
*where*: the file, the key path written the way the user reads it (``storage.backends[1].url``,
``services[0].mappings[2].cost``) and the value.  pydantic puts a discriminated union's tag in
the path (``fetcher.source.scopes``); the path is walked through the input itself, so a tag, which
is not a key of the mapping (or list) it is found in, is dropped, and a list index is shown as ``[i]``
whatever its type, a mapping key as ``.key``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ratebeam.connectors.config_model import INPUT, NOTHING, Invalid
from ratebeam.pipelines.errors import InputError

Model = TypeVar("Model", bound=BaseModel)

_MESSAGES = {
    "missing": "required key is missing",
    "extra_forbidden": "unknown key",
    "model_attributes_type": "expected a mapping",
    "dict_type": "expected a mapping",
}


def validate(model: type[Model], data: Any, source: str, context: dict[str, Any] | None = None,
             top: str = "(top level)") -> Model:
    """``data`` as ``model``, or the ``InputError`` of its first mistake (``top`` names the root)."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise input_error(exc, data, source, top) from None


def input_error(exc: ValidationError, data: Any, source: str, top: str = "(top level)") -> InputError:
    """The ``InputError`` of the first error of ``exc``, raised while validating ``data``."""
    error = exc.errors(include_url=False)[0]
    loc: tuple[Any, ...] = tuple(error["loc"])
    value: Any = error.get("input", NOTHING)
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, Invalid):
        message, loc = cause.message, loc + cause.at
        value = value if cause.value is INPUT else cause.value
        if cause.at and cause.value is INPUT:
            value = NOTHING
    elif isinstance(cause, ValueError):
        message = str(cause)
    else:
        message = _MESSAGES.get(error["type"], error["msg"])
        if error["type"] in ("missing", "extra_forbidden"):
            value = NOTHING
    location = key_path(data, loc) or top
    return InputError(source, location, message) if value is NOTHING else InputError(source, location, message, value)


def key_path(data: Any, loc: Iterable[Any]) -> str:
    """``loc`` as ``a.b[1].c``, read through ``data`` (union tags dropped, indexes in brackets)."""
    path, node, parts = "", data, tuple(loc)
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        if isinstance(part, str) and (
                not isinstance(node, dict) or (part not in node and (not last or node.get("backend") == part))):
            continue  # a union's tag (``source``, ``one``): not a key of the mapping it is found in
        if isinstance(node, dict):
            path = f"{path}.{part}" if path else str(part)
            node = node.get(part)
        elif isinstance(node, list | tuple) and isinstance(part, int):
            path = f"{path}[{part}]"
            node = node[part] if 0 <= part < len(node) else None
        else:
            path, node = f"{path}[{part}]", None
    return path
