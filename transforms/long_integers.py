"""Where JSON text holds an integer over Python's 4,300-digit conversion limit, a ``NaN`` or a lone surrogate.

Python's ``json`` refuses such an integer with a bare ``ValueError`` (``int()`` of its text), and
Polars' JSON reader with "InvalidNumber at character N" of an unnamed line: neither says where.
A user needs the line, the column and the key: this finds them, once a reader has
failed, by parsing the text again with the integer kept aside.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

#: Stands, in the parsed document, for the integer over the limit (its key path is looked up).
_TOO_LONG = object()


def find_long_integer(text: str) -> tuple[int, int, str] | None:
    """(line, column, key path) of the first integer of the JSON ``text`` over the limit, both 1-based.

    None when there is none, or when ``text`` is not JSON for another reason.  The key path reads
    ``services[0].mappings[1].cost``; it is empty for a document that is the integer itself.
    """
    found = False

    def integer(digits: str) -> Any:
        nonlocal found
        try:
            return int(digits)
        except ValueError:  # over sys.get_int_max_str_digits()
            found = True
            return _TOO_LONG

    try:
        document = json.loads(text, parse_int=integer, parse_float=str, parse_constant=str)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    offset = _first_long_integer(text)
    return _located(text, offset, _path_to(document, lambda node: node is _TOO_LONG))


def _located(text: str, offset: int, path: str) -> tuple[int, int, str]:
    """(line, column, path) of ``offset`` in ``text``, both 1-based."""
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset), path


#: A JSON string literal (escapes included): skipped whole when looking for something outside strings.
_STRING = r'"(?:[^"\\]|\\.)*"'


def find_constant(text: str) -> tuple[int, int, str] | None:
    """(line, column, key path) of the first ``NaN``, ``Infinity`` or ``-Infinity`` of ``text``.

    None when there is none or ``text`` is no JSON for another reason (``json`` accepts them; JSON
    does not).
    """
    try:
        document = json.loads(text, parse_constant=lambda name: _TOO_LONG)
    except (ValueError, RecursionError):
        return None
    found = next((m for m in re.finditer(rf"{_STRING}|-?(?:NaN|Infinity)", text) if not m.group().startswith('"')),
                 None)
    if found is None:
        return None
    return _located(text, found.start(), _path_to(document, lambda node: node is _TOO_LONG))


def _unencodable(node: Any) -> bool:
    if not isinstance(node, str):
        return False
    try:
        node.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_lone_surrogate(text: str) -> tuple[int, int, str] | None:
    """(line, column, key path) of the first string (or key) of ``text`` holding a lone surrogate escape."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    for match in re.finditer(_STRING, text):
        if _unencodable(json.loads(match.group())):
            return _located(text, match.start(), _path_to(document, _unencodable, keys=True))
    return None


def _first_long_integer(text: str) -> int:
    """Where the first integer over the limit begins in ``text`` (valid JSON: parsed already).

    Strings are skipped whole (an escaped quote included), so digits inside one are never taken,
    nor are the digits of a number's fraction or exponent.
    """
    limit = sys.get_int_max_str_digits()
    pattern = rf'"(?:[^"\\]|\\.)*"|(?<![0-9.eE+-])-?[0-9]{{{limit + 1},}}(?![0-9.eE])'
    return next((m.start() for m in re.finditer(pattern, text) if not m.group().startswith('"')), 0)


def _path_to(document: Any, wanted: Callable[[Any], bool], *, keys: bool = False) -> str:
    """The key path of the first node of ``document`` that is ``wanted``, in the order of the text.

    ``keys``: a key that is ``wanted`` counts too (its path names it).
    """
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:  # a loop, not recursion: the document may be as deep as json allowed
        node, path = stack.pop()
        if wanted(node):
            return path
        if isinstance(node, dict):
            if keys:
                bad = next((key for key in node if wanted(key)), None)
                if bad is not None:
                    return f"{path}.{bad!a}" if path else ascii(bad)
            stack.extend((value, f"{path}.{key}" if path else str(key)) for key, value in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node))))
    return ""
