"""The notification source's options (``events.source`` in ``ratebeam.yaml``).

```yaml
events:
  source:
    transport_url: rabbit://user:pass@rabbit-1:5672/     # oslo.messaging's URL (rabbit:// or amqp://)
    exchanges: [nova, cinder, neutron]                   # each service's control_exchange
    topics: [notifications, versioned_notifications]     # oslo's notification topics (Nova's versioned too)
    priorities: [info]                                   # routing keys <topic>.<priority>
    queue: ratebeam-notifications                        # ratebeam's own durable queue
    durable_exchanges: false                             # as the services declare them (amqp_durable_queues)
    prefetch: 500
    poll_seconds: 1
    wall_clock_lag: 600                                  # null: event time moves with the notifications only
```
ratebeam's queue is its own, durable, bound to each exchange with ``<topic>.<priority>``: it does
not take messages from Ceilometer's ``notifications.info`` queue, and keeps what arrives while
ratebeam is down.  ``versioned_notifications`` is Nova's topic for its versioned notifications
(``[notifications] notification_format = versioned | both``, ``versioned_notifications_topics``),
on the same ``nova`` exchange; a Nova sending only the legacy format sends nothing there, one
sending both has each change billed once (docs/events.md, "Nova's versioned notifications").  The exchanges are declared as the services declare them (topic, not
auto-deleted, ``durable_exchanges``): a mismatch would be refused by the broker.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ratebeam.connectors.config_model import (
    Boolean,
    ConfigModel,
    Invalid,
    NonEmptyStr,
    NonEmptyStringList,
    integer,
    seconds,
)

#: oslo.messaging's transport schemes that are AMQP 0-9-1 (kombu's ``amqp://``).
_SCHEMES = ("rabbit", "amqp")


class NotificationSourceConfig(ConfigModel):
    """Where the notifications come from and how they are read (see the module docstring)."""

    transport_url: NonEmptyStr = Field(description="oslo.messaging's URL of the bus (`rabbit://` or `amqp://`).")
    exchanges: NonEmptyStringList = Field(("nova", "cinder", "neutron", "openstack"), description="Each service's `control_exchange`.")
    topics: NonEmptyStringList = Field(("notifications", "versioned_notifications"), description="oslo's notification topics (`versioned_notifications`: Nova's versioned ones).")
    priorities: NonEmptyStringList = Field(("info",), description="Bound as routing keys `<topic>.<priority>`.")
    queue: NonEmptyStr = Field("ratebeam-notifications", description="ratebeam's own durable queue.")
    durable_exchanges: Boolean = Field(False, description="Declare the exchanges durable, as the services do (`amqp_durable_queues`).")
    #: basic.qos prefetch_count is an AMQP short (0-9-1 spec): at most 65535.
    prefetch: integer(1, 65_535) = Field(500, description="Messages delivered before they are acknowledged (acknowledged once in the inbox); at most 65535, AMQP's limit.")  # type: ignore[valid-type]  # built at run time (config_model)
    poll_seconds: seconds(0, 3600) = Field(1.0, description="Seconds between two reads of the queue when it is empty.")  # type: ignore[valid-type]  # built at run time (config_model)
    wall_clock_lag: seconds(0, 366 * 86400) | None = Field(600.0, description="Event time moves on with the wall clock minus this many seconds when no notification comes; null: with the notifications only.")  # type: ignore[valid-type]  # built at run time

    @field_validator("transport_url")
    @classmethod
    def _amqp(cls, url: str) -> str:
        if urlsplit(url).scheme not in _SCHEMES or not urlsplit(url).hostname:
            raise Invalid("expected a rabbit:// or amqp:// URL with a host",
                          urlsplit(url)._replace(netloc=urlsplit(url).hostname or "").geturl())
        return url

    @property
    def routing_keys(self) -> tuple[str, ...]:
        """``<topic>.<priority>`` for each topic and priority: what oslo's notifier publishes with."""
        return tuple(f"{t}.{p}" for t in self.topics for p in self.priorities)

    @property
    def broker_url(self) -> str:
        """The URL kombu connects to (oslo's ``rabbit://`` is AMQP 0-9-1)."""
        parts = urlsplit(self.transport_url)
        return parts._replace(scheme="amqp").geturl()
