r"""The LogQL ratebeam sends: stream selectors, label filters and line filters, every value escaped.

A value is never pasted raw: strings are LogQL (Go) double-quoted literals — ``json.dumps`` without
ASCII escaping spells exactly those (``"``, ``\\`` and control characters escaped) — and a value
inside a regular expression is first escaped as RE2's ``QuoteMeta`` does, so a scope id holding
``"``, ``\\``, ``}`` or ``|`` cannot end the literal, the selector or the alternation.

Reads are ``{<stream labels>, scope_id=~"a|b"} | json | (type="x" or type="y") | (groupby_k="v" or
metadata_k="v")``: a superset of the selection (LogQL cannot tell an absent label from ``''``, and
label names it cannot spell are not filtered), refined exactly by ``frame_selection`` afterwards.
Deletes take a stream selector and line filters only (Loki's delete API accepts no parser stage):
by type with a regular expression anchored at the line's start, or by point id at its end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from ratebeam.connectors.storage.base import Selection
from ratebeam.connectors.storage.loki.config import LABEL_NAME
from ratebeam.connectors.storage.loki.lines import ID_KEY, SCOPE_KEY

_RE2_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def string(value: str) -> str:
    """A LogQL double-quoted string literal of ``value``."""
    return json.dumps(value, ensure_ascii=False)


def quote_meta(text: str) -> str:
    """``text`` matched literally by RE2 (Go's ``regexp.QuoteMeta``)."""
    return _RE2_META.sub(r"\\\1", text)


def alternation(values: Iterable[str]) -> str:
    """A regular expression matching exactly one of ``values``."""
    return "|".join(quote_meta(v) for v in sorted(values))


#: The stream label CloudKitty's Loki driver files a scope's lines under, whatever its scope key.
CLOUDKITTY_SCOPE_LABEL = "project_id"


def selector(stream: dict[str, str], scopes: frozenset[str] | None, label: str = SCOPE_KEY) -> str:
    """``{label="value", ..., scope_id=~"a|b"}`` (``label``: CloudKitty's lines are under ``project_id``)."""
    matchers = [f"{name}={string(value)}" for name, value in stream.items()]
    if scopes is not None:
        if len(scopes) == 1:
            matchers.append(f"{label}={string(next(iter(scopes)))}")
        else:
            matchers.append(f"{label}=~{string(alternation(scopes))}")
    return "{" + ", ".join(matchers) + "}"


def _any_of(names: list[str], values: frozenset[str]) -> str:
    tests = [f"{name}={string(value)}" for name in names for value in sorted(values)]
    return "(" + " or ".join(tests) + ")"


def read_query(stream: dict[str, str], selection: Selection, label: str = SCOPE_KEY) -> str:
    """The ``query_range`` query of ``selection`` (a superset: see the module docstring)."""
    stages = [selector(stream, selection.scopes, label), "json"]
    if selection.types is not None:
        stages.append(_any_of(["type"], selection.types))
    for key, values in sorted(selection.labels.items()):
        if LABEL_NAME.match(key):
            stages.append(_any_of([f"groupby_{key}", f"metadata_{key}"], values))
    return " | ".join(stages)


def type_filter(types: frozenset[str]) -> str:
    """A line filter keeping the lines whose ``type`` (the third key, CloudKitty's order) is in ``types``.

    Spaces after ``:`` and ``,`` are optional: CloudKitty's ``json.dumps`` writes them, ratebeam not.
    """
    spelled = alternation(string(t) for t in types)
    regex = rf'^\{{"start": ?"[^"]*", ?"end": ?"[^"]*", ?"type": ?(?:{spelled}),'
    return f"|~ {string(regex)}"


def id_filter(point_ids: Iterable[str]) -> str:
    """A line filter keeping the lines whose ``point_id`` (the last key) is one of ``point_ids``."""
    regex = rf'"{ID_KEY}":"(?:{alternation(point_ids)})"\}}$'
    return f"|~ {string(regex)}"


def line_filter(line: str) -> str:
    """A line filter keeping exactly ``line`` (a JSON object cannot hold another one unescaped)."""
    return f"|= {string(line)}"
