"""A clean SIGTERM of ``ratebeam events serve``: exit 0, no traceback, and a log that says what it stops.

Real RabbitMQ and Prism (LOOPBACK: the SDK worker runs in the launcher, so whatever it prints while
the job is cancelled would be on this stderr).  Stopped several times, each time while the job is
reading notifications: tracebacks of the worker (``KeyError`` of an instruction, gRPC ``UNAVAILABLE``)
were printed by most stops before.
"""

from __future__ import annotations

from bus_support import message, nova_instance, publish_many
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)
from test_events_catch_up import events_config, recorded
from test_events_stream import Serving, at, wait_for

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

STOPS = 5


def test_sigterm_stops_the_stream_cleanly_and_says_what_it_stops(tmp_path, rabbitmq_url, prism_endpoint):  # noqa: F811
    config = events_config(tmp_path / "ws", rabbitmq_url, "rb-stops")
    for stop in range(STOPS):
        serving = Serving(config, prism_endpoint)
        try:
            wait_for(lambda s=serving: "events serve: run" in s.log(), "the job to start", serving, config)
            created = at("10:00")
            publish_many(rabbitmq_url, [("nova", message(
                "compute.instance.create.end", nova_instance(f"vm-{stop}-{k}", "t-1", "m1.small", created), created,
                message_id=f"create-{stop}-{k}")) for k in range(20)])
            wait_for(lambda s=stop: recorded(config) == 20 * (s + 1), "the notifications to be read", serving, config)
        finally:
            code = serving.stop()
        text = serving.path.read_text()
        assert code == 0, text
        assert "Traceback" not in text, text
        assert "SIGTERM: cancelling the event-stream job" in text
        assert "current tick" not in text
        assert "ratebeam events serve: stopped after 1 job(s)" in text
