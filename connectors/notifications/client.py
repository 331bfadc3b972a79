"""The kombu consumer of the notification queue: durable, bound to the services' exchanges, manual ack.

Delivery guarantee: at least once.  :meth:`NotificationConsumer.receive` returns what the broker
delivered (at most ``prefetch`` unacknowledged messages); the caller records them durably (the
SQL inbox) and only then calls :meth:`NotificationConsumer.ack`, which acknowledges them all in one
``basic.ack(multiple)``.  A consumer that dies before has its messages delivered again (to itself
once it reconnects, or to another consumer of the queue); the inbox's ``message_id`` key makes
the second copy a no-op.  Broker errors raise ``RetriableConnectorError``: the caller (the
source's poll loop, the one retrying layer) reconnects at its next poll.

Backlog: a ``receive`` that ends with room left in the prefetch window asks the broker (a passive
``queue.declare``) how many messages are still ready.  The broker answers on the channel after the
deliveries it sent before, which the wait dispatches into this receive's list, so ``drained``
means: every message published before that answer is in the list (or was received before).  The
event source lets event time follow the wall clock only then (``pipelines/events/source.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

import kombu
from kombu.exceptions import KombuError
from kombu.message import Message

from ratebeam.connectors.errors import RetriableConnectorError
from ratebeam.connectors.notifications.config import NotificationSourceConfig

#: How long ``receive`` waits for the next message once it has one (the end of a burst).
_BURST_GAP = 0.05
_BROKER_ERRORS = (KombuError, OSError)  # socket timeouts and connection errors are OSErrors


@dataclass(frozen=True)
class Delivery:
    """One message as the broker delivered it: its body, to be recorded, then acknowledged."""

    body: bytes
    tag: int


class NotificationConsumer:
    """Reads the configured queue (declared and bound on connect), acknowledging only when told."""

    def __init__(self, config: NotificationSourceConfig) -> None:
        self._config = config
        self._connection: kombu.Connection | None = None
        self._pending: list[Message] = []
        self._bound: kombu.Queue | None = None
        #: Whether the last :meth:`receive` left no message ready on the queue (module docstring).
        self.drained = False

    def _queue(self) -> kombu.Queue:
        c = self._config
        exchanges = [kombu.Exchange(name, type="topic", durable=c.durable_exchanges, auto_delete=False)
                     for name in c.exchanges]
        bindings = [kombu.binding(exchange, routing_key=key) for exchange in exchanges for key in c.routing_keys]
        return kombu.Queue(c.queue, bindings=bindings, durable=True, auto_delete=False)

    def _connect(self) -> None:
        connection = kombu.Connection(self._config.broker_url, connect_timeout=10)
        try:
            connection.ensure_connection(max_retries=1)
            channel = connection.channel()
            queue = self._queue().bind(channel)
            for exchange in {b.exchange.name: b.exchange for b in queue.bindings}.values():
                exchange.bind(channel).declare()
            queue.declare()
            self._bound = queue
            self._consumer = kombu.Consumer(channel, queues=[queue], on_message=self._pending.append,
                                            no_ack=False, prefetch_count=self._config.prefetch)
            self._consumer.consume()
        except _BROKER_ERRORS as exc:
            connection.release()
            raise RetriableConnectorError(f"RabbitMQ at {_shown(self._config.broker_url)}: {exc}") from exc
        self._connection = connection

    def declare(self) -> None:
        """Declare the exchanges, the durable queue and its bindings now (from then on nothing published is lost)."""
        self._connect()
        self.close()

    def receive(self, wait: float) -> list[Delivery]:
        """The messages delivered within ``wait`` seconds (a burst is read to its end), not yet acked."""
        if self._connection is None:
            self._connect()
        assert self._connection is not None
        timeout = wait
        self.drained = False
        try:
            while len(self._pending) < self._config.prefetch:
                try:
                    self._connection.drain_events(timeout=timeout)
                except TimeoutError:
                    break
                timeout = _BURST_GAP
            if len(self._pending) < self._config.prefetch:
                assert self._bound is not None
                self.drained = self._bound.queue_declare(passive=True).message_count == 0
        except _BROKER_ERRORS as exc:
            self.close()
            raise RetriableConnectorError(f"RabbitMQ at {_shown(self._config.broker_url)}: {exc}") from exc
        return [Delivery(_bytes(m.body), m.delivery_tag) for m in self._pending]

    def ack(self) -> None:
        """Acknowledge every message :meth:`receive` returned (they are recorded)."""
        if not self._pending:
            return
        try:
            self._pending[-1].ack(multiple=True)
        except _BROKER_ERRORS as exc:  # the broker will deliver them again: the inbox ignores the copies
            self.close()
            raise RetriableConnectorError(f"RabbitMQ at {_shown(self._config.broker_url)}: ack: {exc}") from exc
        self._pending.clear()

    def close(self) -> None:
        """Close the connection; unacknowledged messages go back to the queue."""
        self._pending.clear()
        self.drained = False
        if self._connection is not None:
            with contextlib.suppress(*_BROKER_ERRORS):
                self._connection.release()
            self._connection = None


def _bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


def _shown(url: str) -> str:
    """The broker's host and port, without the credentials (for messages)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"
