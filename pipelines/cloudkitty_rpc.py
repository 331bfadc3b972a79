"""CloudKitty's RPC, served by ratebeam: what CloudKitty's API asks of its processor over RabbitMQ.

CloudKitty's API talks to ``cloudkitty-processor`` only through oslo.messaging:
exchange ``cloudkitty``, topic ``cloudkitty``, RPC version 1.0.  With ratebeam in the processor's
place nobody listened, so ``PUT /v2/scope`` (a cast) was silently lost and ``POST
/v1/rating/quote`` (a call) timed out.  :func:`serve_rpc` joins that topic with one server per
process (as each CloudKitty processor worker does: casts go round-robin to one of them, fanouts to
all) and handles every method the API sends:

* ``reset_state`` (cast): for each scope, :func:`ratebeam.pipelines.commands.state.reset_scope`,
  the code of ``ratebeam state reset``, so the data is deleted from the timestamp on (by the scope
  key too, so CloudKitty's pre-switch points go) and the state moved, under the scope's lease.
  Unlike CloudKitty the period at the timestamp is rated again (a timestamp inside a period
  re-rates that whole period); a failure is logged (a cast has no reply to carry it).
* ``quote`` (call): the usage priced with the current rules and module chain, through the kernel
  of ``ratebeam run`` / ``ratebeam rate``, at ``now`` with the global rules (CloudKitty's API
  worker has no scope); the reply is the price as a string, as CloudKitty's.
* ``reload_modules``, ``reload_module``, ``enable_module``, ``disable_module`` (casts): CloudKitty
  only stores a flag it never reads; ratebeam reads modules and rules at each run.  Acknowledged
  and logged.  The endpoint answers RPC version 1.1 too (the API sends ``reload_modules`` at 1.1,
  which CloudKitty's own 1.0 endpoint refuses).

Needs the ``cloudkitty-rpc`` extra (``pip install 'ratebeam[cloudkitty-rpc]'``: oslo.messaging).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ratebeam.pipelines.commands.common import CommandError, engine_of
from ratebeam.pipelines.errors import InputError

if TYPE_CHECKING:
    from ratebeam.pipelines.config import RatebeamConfig
    from ratebeam.pipelines.ops.health import JobState, ServiceMonitor

LOG = logging.getLogger(__name__)

#: CloudKitty's exchange and topic (``cloudkitty/messaging.py``).
EXCHANGE = TOPIC = "cloudkitty"


class RpcUnavailable(Exception):
    """The transport URL is unusable; the message says why."""


def _oslo_messaging() -> Any:
    from ratebeam.connectors.extras import require_extra

    return require_extra("cloudkitty-rpc", "CloudKitty's RPC (rpc, serve --rpc)")


def floor_to_period(moment: datetime, period: int) -> datetime:
    """The begin of the period holding ``moment`` (periods are aligned on the Unix epoch)."""
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % period, UTC)


class ScopeEndpoint:
    """``reset_state``, CloudKitty's ``ScopeEndpoint`` (no namespace)."""

    def __init__(self, config: RatebeamConfig) -> None:
        self.config = config
        self.target = _oslo_messaging().Target(version="1.1")

    def reset_state(self, ctxt: dict, res_data: dict[str, Any]) -> None:
        """Reset each listed scope to ``last_processed_timestamp`` (see the module docstring)."""
        from ratebeam.connectors.sql.state_store import StateStore
        from ratebeam.pipelines.commands.state import reset_scope

        try:
            moment = datetime.fromisoformat(res_data["last_processed_timestamp"])
        except (KeyError, TypeError, ValueError):
            LOG.error("reset_state: no usable last_processed_timestamp in %s", json.dumps(res_data, default=str))
            return
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
        begin = floor_to_period(moment, self.config.period)
        engine = engine_of(self.config)
        try:
            for scope in res_data.get("scopes", []):
                store = StateStore(engine, scope.get("scope_key") or self.config.scope_key,
                                   scope.get("fetcher") or self.config.fetcher.backend,
                                   scope.get("collector") or self.config.collector.backend)
                try:
                    reset_scope(self.config, store, scope["scope_id"], begin)
                except (CommandError, InputError) as exc:
                    LOG.error("reset_state of scope %s from %s failed: %s", scope.get("scope_id"),
                              begin.isoformat(), exc)
        finally:
            engine.dispose()


class RatingEndpoint:
    """``quote`` and the module notifications, CloudKitty's ``RatingEndpoint`` (namespace ``rating``)."""

    def __init__(self, config: RatebeamConfig) -> None:
        self.config = config
        self.target = _oslo_messaging().Target(namespace="rating", version="1.1")

    def quote(self, ctxt: dict, res_data: dict[str, Any]) -> str:
        """The price of ``res_data["usage"]`` (``{service: [{"desc", "vol"}]}``) as a string."""
        return str(quote(self.config, res_data.get("usage") or {}, datetime.now(UTC)))

    def reload_modules(self, ctxt: dict) -> None:
        """Acknowledged: ratebeam reads the modules at each run."""
        LOG.info("reload_modules received: modules and rules are read at each run")

    def reload_module(self, ctxt: dict, name: str) -> None:
        """Acknowledged: ratebeam reads the modules at each run."""
        LOG.info("reload_module %s received: modules and rules are read at each run", name)

    def enable_module(self, ctxt: dict, name: str) -> None:
        """Acknowledged: the API already stored the state, which the next run reads."""
        LOG.info("enable_module %s received: the next run reads the module state", name)

    def disable_module(self, ctxt: dict, name: str) -> None:
        """Acknowledged: the API already stored the state, which the next run reads."""
        LOG.info("disable_module %s received: the next run reads the module state", name)


def quote(config: RatebeamConfig, usage: dict[str, list[dict[str, Any]]], now: datetime) -> Decimal:
    """Price CloudKitty's quote usage at ``now`` with the database's rules, modules and scripts.

    Each entry is ``{"desc": {"groupby": {...}, "metadata": {...}}, "vol": {"qty", "unit"}}``; a
    period ``[now, now + period)`` as CloudKitty's API worker uses, no scope (global rules only).
    """
    import polars as pl

    from ratebeam.pipelines.interchange.usage import parse_usage
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.transforms.schema import PRICE, SCOPE

    end = now + timedelta(seconds=config.period)
    points = [
        {"type": service, "qty": str(entry.get("vol", {}).get("qty", "0")), "unit": entry.get("vol", {}).get("unit"),
         "begin": now.isoformat(), "end": end.isoformat(),
         "groupby": (entry.get("desc") or {}).get("groupby") or {},
         "metadata": (entry.get("desc") or {}).get("metadata") or {}}
        for service, entries in usage.items() for entry in entries
    ]
    if not points:
        return Decimal(0)
    frame = parse_usage(json.dumps(points), "quote").with_columns(pl.lit(None, pl.String).alias(SCOPE))
    engine = engine_of(config)
    try:
        assert config.metrics is not None  # loaded with metrics
        rater = load_rater(engine, config.metrics)()
    finally:
        engine.dispose()
    rated, failures = rater(frame)
    if failures:
        raise ValueError(f"quote: rating failed: {failures[0]}")
    total = sum(rated[PRICE].to_list(), Decimal(0))
    return total.normalize() if total else Decimal(0)


#: Seconds between two heartbeats of the serving loop (``/healthz/live``) while it waits for a stop.
BEAT_SECONDS = 1.0


class _Counted:
    """An endpoint whose public methods count their calls (``ratebeam_rpc_calls_total``) as they return or fail.

    oslo.messaging's dispatcher reads the endpoint's ``target`` and its methods by name: both pass through.
    """

    def __init__(self, endpoint: object, calls: Any) -> None:
        self._endpoint, self._calls = endpoint, calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._endpoint, name)
        if name.startswith("_") or name == "target" or not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attribute(*args, **kwargs)
            except Exception:
                self._calls.count(name, "error")
                raise
            self._calls.count(name, "ok")
            return result

        return counted


def serve_rpc(config: RatebeamConfig, transport_url: str, host: str | None = None,
              stop: threading.Event | None = None, monitor: ServiceMonitor | None = None,
              state: JobState | None = None) -> None:
    """Serve CloudKitty's RPC on ``transport_url`` until ``stop`` is set (or forever).

    With a ``monitor`` (``rpc --metrics-port``): the loop beats every ``BEAT_SECONDS``, calls are
    counted on ``/metrics``; ``state`` is RUNNING from the moment the server has joined the topic.
    On stop the server stops taking messages and waits for the calls in progress to finish (a
    ``reset_state`` under way completes its scope; one not started stays in the queue).
    """
    oslo_messaging = _oslo_messaging()
    from oslo_config import cfg

    # oslo.messaging reads some of its options (tracing) from the global CONF whatever it is given.
    cfg.CONF([], project="ratebeam", default_config_files=[], default_config_dirs=[])
    oslo_messaging.set_transport_defaults(EXCHANGE)
    try:
        transport = oslo_messaging.get_rpc_transport(cfg.CONF, url=transport_url)
    except (oslo_messaging.InvalidTransportURL, oslo_messaging.DriverLoadFailure) as exc:
        raise RpcUnavailable(f"--transport-url {transport_url!r}: {exc}") from None
    target = oslo_messaging.Target(topic=TOPIC, server=host or socket.gethostname(), version="1.0")
    endpoints: list[object] = [RatingEndpoint(config), ScopeEndpoint(config)]
    if monitor is not None:
        from ratebeam.pipelines.ops.figures import CallCounts

        calls = CallCounts()
        monitor.register(calls)
        endpoints = [_Counted(e, calls) for e in endpoints]
    server = oslo_messaging.get_rpc_server(
        transport, target, endpoints, executor="threading", access_policy=oslo_messaging.DefaultRPCAccessPolicy,
    )
    server.start()
    if state is not None:
        state.state = "RUNNING"
    LOG.info("serving CloudKitty's RPC: exchange %s, topic %s, server %s", EXCHANGE, TOPIC, target.server)
    stop = stop or threading.Event()
    try:
        while not stop.wait(BEAT_SECONDS):
            if monitor is not None:
                monitor.beat()
    finally:
        if state is not None:
            state.state = "STOPPING"
        server.stop()
        server.wait()
        transport.cleanup()

