"""Where JSON text holds an integer over Python's 4,300-digit conversion limit.

Python's ``json`` refuses such an integer with a bare ``ValueError`` (``int()`` of its text), and
Polars' JSON reader with "InvalidNumber at character N" of an unnamed line: neither says where.
A user needs the line, the column and the key: this finds them, once a reader has
failed, by parsing the text again with the integer kept aside.
"""

from __future__ import annotations

import json
import re
import sys
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
    line = text.count("\n", 0, offset) + 1
    return line, offset - text.rfind("\n", 0, offset), _path_to(document)


def _first_long_integer(text: str) -> int:
    """Where the first integer over the limit begins in ``text`` (valid JSON: parsed already).

    Strings are skipped whole (an escaped quote included), so digits inside one are never taken,
    nor are the digits of a number's fraction or exponent.
    """
    limit = sys.get_int_max_str_digits()
    pattern = rf'"(?:[^"\\]|\\.)*"|(?<![0-9.eE+-])-?[0-9]{{{limit + 1},}}(?![0-9.eE])'
    return next((m.start() for m in re.finditer(pattern, text) if not m.group().startswith('"')), 0)


def _path_to(document: Any) -> str:
    """The key path of the first ``_TOO_LONG`` in ``document``, in the order of the text."""
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:  # a loop, not recursion: the document may be as deep as json allowed
        node, path = stack.pop()
        if node is _TOO_LONG:
            return path
        if isinstance(node, dict):
            stack.extend((value, f"{path}.{key}" if path else str(key)) for key, value in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node))))
    return ""
