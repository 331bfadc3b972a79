"""Which event types a definition or a criterion takes: shell globs, ``!`` excludes (Ceilometer's rule).

``['*.start', '*.end', '!scheduler.*']`` takes ``compute.instance.create.start`` but not
``scheduler.run_instance.start``; a list of exclusions only (``'!image.*'``) takes everything else.
Matching is case-sensitive (``fnmatchcase``), as event types are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

#: Event types whose answer a filter remembers (a cloud has a few hundred; more are answered, not kept).
remembered = 4096


@dataclass(frozen=True)
class EventTypes:
    """The globs a type must match (any of) and must not match (none of)."""

    included: tuple[str, ...]
    excluded: tuple[str, ...]
    #: event type → whether it is taken: the globs are matched once per type (they were most of the
    #: conversion's and the triggers' time, called for every definition, criterion and lifecycle kind)
    _taken: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def parse(patterns: tuple[str, ...]) -> EventTypes:
        """The filter of a definition's ``event_type`` list (``!glob`` excludes)."""
        excluded = tuple(p[1:] for p in patterns if p.startswith("!"))
        included = tuple(p for p in patterns if not p.startswith("!"))
        return EventTypes(included or ("*",), excluded)

    def __call__(self, event_type: str) -> bool:
        """Whether ``event_type`` is taken."""
        taken = self._taken.get(event_type)
        if taken is None:
            taken = (any(fnmatchcase(event_type, p) for p in self.included)
                     and not any(fnmatchcase(event_type, p) for p in self.excluded))
            if len(self._taken) < remembered:
                self._taken[event_type] = taken
        return taken

    @property
    def catch_all(self) -> bool:
        """Takes every type (``'*'`` without exclusions)."""
        return "*" in self.included and not self.excluded
