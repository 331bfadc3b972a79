"""The one error type for bad user input (rules files, usage files, scripts, configuration).

A user who feeds ratebeam a wrong file must get one line saying which file, where in it and what is
wrong (``rules.json: services[0].mappings[1].cost: not a decimal: 'abc'``), never a traceback; the
CLI prints ``str(error)`` and exits with status 2.
"""

from __future__ import annotations

import reprlib

_UNSET = object()
#: Longest value excerpt shown: a whole mis-indented section is not one line.
_EXCERPT = 200
#: Builds that excerpt without building the whole ``repr`` first: a YAML bomb (a few anchors
#: expanding to millions of strings) would take seconds and megabytes to ``repr`` in full.
_REPR = reprlib.Repr()  # Python 3.11's Repr takes no arguments: its limits are attributes
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 4, _EXCERPT, _EXCERPT, 60
_REPR.maxtuple = _REPR.maxlist = _REPR.maxdict = _REPR.maxset = 8
#: Longest message: a message may quote what it refuses (a key, a list of choices).
MAX_MESSAGE = 400
#: Longest line the CLI prints for an error, whatever raised it: a connector's message may quote
#: what a file or a server held (a 5,000-digit value), and only its beginning says where.
MAX_LINE = 1000


def excerpt(value: object) -> str:
    """``repr(value)``, but at most about ``_EXCERPT`` characters and never built in full."""
    try:
        shown = _REPR.repr(value) if isinstance(value, list | tuple | dict | set | frozenset) else repr(value)
    except ValueError:  # an int over Python's 4,300-digit conversion limit
        shown = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else type(value).__name__
    return shown if len(shown) <= _EXCERPT else shown[:_EXCERPT] + "..."


def short(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters (with ``...`` when cut)."""
    return message if len(message) <= limit else message[:limit] + "..."


class InputError(Exception):
    """Bad input: ``source`` (the file as the user named it), ``location`` (key path or line) and why.

    ``value`` is the offending value when there is one; it is shown with ``repr`` after the message,
    cut to its first 200 characters (``excerpt``); the message itself is cut to 400 (``short``).
    """

    def __init__(self, source: str, location: str, message: str, value: object = _UNSET) -> None:
        self.source = str(source)
        self.location = location
        self.message = short(message)
        self.has_value = value is not _UNSET
        self.value = None if value is _UNSET else value
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [self.source]
        if self.location:
            parts.append(self.location)
        if self.has_value:
            parts.append(f"{self.message}: {excerpt(self.value)}")
        else:
            parts.append(self.message)
        return ": ".join(parts)
