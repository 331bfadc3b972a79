"""The part every storage backend over an HTTP API shares: its options and one client made lazily.

InfluxDB, Loki and Elasticsearch/OpenSearch backends are built on workers (``DoFn.setup``) and by
commands that never send a request (``ratebeam storage info``), so the client is made at first
use: building a backend opens nothing.  ``close`` releases the client; a later call makes another.
"""

from __future__ import annotations

import abc
from typing import Generic, Protocol, TypeVar

from ratebeam.connectors.storage.base import StorageBackend


class _Closable(Protocol):
    def close(self) -> None: ...


OptionsT = TypeVar("OptionsT")
ClientT = TypeVar("ClientT", bound=_Closable)


class HttpStorageBackend(StorageBackend, Generic[OptionsT, ClientT]):
    """A backend built from ``options`` talking to its server through ``http`` (made by ``_connect``)."""

    def __init__(self, options: OptionsT) -> None:
        self.options = options
        self._client: ClientT | None = None

    @abc.abstractmethod
    def _connect(self) -> ClientT:
        """A new HTTP client for ``self.options``."""

    @property
    def http(self) -> ClientT:
        """The HTTP client, made at first use."""
        if self._client is None:
            self._client = self._connect()
        return self._client

    def close(self) -> None:
        """Close the HTTP client, if one was made."""
        if self._client is not None:
            self._client.close()
            self._client = None
