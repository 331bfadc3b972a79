"""The error taxonomy every connector raises, deciding what the pipeline does next.

Modelled on the Singer SDK: a *fatal* error stops the run (bad configuration, missing table), a
*retriable* one is retried with backoff and then fails only its (scope, period), a *skippable* one
is logged and counted and the element is dropped on purpose (e.g. a metric with no data).
"""

from __future__ import annotations


class ConnectorError(Exception):
    """Base class: something an external system did or said."""


class FatalConnectorError(ConnectorError):
    """Retrying cannot help: wrong credentials, unknown database, malformed configuration."""


class RetriableConnectorError(ConnectorError):
    """A transient failure (connection refused, timeout, 429, 5xx): retry with backoff."""


class SkippableConnectorError(ConnectorError):
    """The element cannot be processed but the rest of the work is fine (logged and counted)."""


class NoDataCollected(SkippableConnectorError):
    """A metric has no usage for one scope and period: that metric is simply absent (spec §6.4)."""
