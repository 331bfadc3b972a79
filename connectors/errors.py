"""The error taxonomy every connector raises, and the one rule that decides what the pipeline does.

Modelled on the Singer SDK.  What each class makes the pipeline do:

* ``FatalConnectorError`` — retrying cannot help (wrong credentials, a TLS failure, a 4xx that
  will never succeed, an unknown database or index, a bad configuration): the **run stops** with one
  line ``ratebeam: <backend> <url>: <reason>`` and exit status 2, no dead letter per frame, and the
  run's leases are released.
* ``RetriableConnectorError`` — transient (connection refused, timeout, 429, 5xx): already retried
  with backoff by the HTTP layer (``connectors.http``, the only layer that retries); the **frame
  fails** (a dead letter) and the next run does it again.
* ``SkippableConnectorError`` — the data of one frame cannot be processed (a label value a backend
  cannot store, a query Prometheus refuses): the **frame fails** at once (a dead letter), the rest of
  the run goes on.  ``NoDataCollected`` is the one skippable error that is not a failure at all.
* anything else is a programming error: it propagates with its traceback.

Beam re-raises a DoFn's exception with an augmented message (FnApiRunner) or only as text
(portable runners), so a fatal error is recognised by text: its message starts with
``FATAL_MARKER`` and ``fatal_in`` finds it anywhere in an exception chain.
"""

from __future__ import annotations

import re

#: Prefix of every fatal error's message, found again in whatever Beam makes of the exception.
FATAL_MARKER = "[ratebeam fatal] "
_FATAL_TEXT = re.compile(re.escape(FATAL_MARKER) + r"(.+)")
_STEP_NOTE = re.compile(r"(?: \[while running '[^']*'\])+.*$")


class ConnectorError(Exception):
    """Base class: something an external system did or said."""


class FatalConnectorError(ConnectorError):
    """Retrying cannot help: the run stops (see the module docstring)."""

    def __init__(self, message: str) -> None:
        # Beam rebuilds the exception from its (augmented) message: never mark it twice.
        self.reason = message.removeprefix(FATAL_MARKER)
        super().__init__(FATAL_MARKER + self.reason)


class RetriableConnectorError(ConnectorError):
    """A transient failure, already retried by the HTTP layer: the frame fails, the next run retries."""


class SkippableConnectorError(ConnectorError):
    """One frame's data cannot be processed: that frame fails at once, the rest goes on."""


class NoDataCollected(SkippableConnectorError):
    """A metric has no usage for one scope and period: that metric is simply absent (`cloudkitty/orchestrator.py:418-443`)."""


def is_frame_failure(exc: ConnectorError) -> bool:
    """True when ``exc`` fails only the frame at hand (retriable or skippable), False if fatal.

    DoFns catch ``ConnectorError`` only and re-raise when this is False: a fatal error stops the run.
    """
    return not isinstance(exc, FatalConnectorError)


def fatal_in(exc: BaseException) -> FatalConnectorError | None:
    """The fatal connector error ``exc`` carries — itself, in its causes, or only as text — or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _FATAL_TEXT.search(str(current))
        if match:
            return FatalConnectorError(_STEP_NOTE.sub("", match.group(1)).strip())
        current = current.__cause__ or current.__context__
    return None
