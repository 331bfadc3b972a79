"""The one error type for bad user input (rules files, usage files, scripts, configuration).

A user who feeds ratebeam a wrong file must get one line saying which file, where in it and what is
wrong (``rules.json: services[0].mappings[1].cost: not a decimal: 'abc'``), never a traceback; the
CLI prints ``str(error)`` and exits with status 2.
"""

from __future__ import annotations

_UNSET = object()
#: Longest value excerpt shown: a whole mis-indented section is not one line.
_EXCERPT = 200


class InputError(Exception):
    """Bad input: ``source`` (the file as the user named it), ``location`` (key path or line) and why.

    ``value`` is the offending value when there is one; it is shown with ``repr`` after the message,
    cut to its first 200 characters.
    """

    def __init__(self, source: str, location: str, message: str, value: object = _UNSET) -> None:
        self.source = str(source)
        self.location = location
        self.message = message
        self.has_value = value is not _UNSET
        self.value = None if value is _UNSET else value
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [self.source]
        if self.location:
            parts.append(self.location)
        if self.has_value:
            shown = repr(self.value)
            parts.append(f"{self.message}: {shown if len(shown) <= _EXCERPT else shown[:_EXCERPT] + '...'}")
        else:
            parts.append(self.message)
        return ": ".join(parts)
