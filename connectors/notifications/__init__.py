"""OpenStack notifications from RabbitMQ: the event stream's source (``ratebeam events serve``).

``config`` — the ``events.source`` options; ``envelope`` — oslo.messaging's v1 / v2 envelope to a
``Notification``; ``client`` — the kombu consumer (durable queue, manual ack); ``inbox`` — the
durable SQL inbox every message is written to before it is acknowledged; ``discrepancies`` — what
the lifecycles found to disagree with Nova's audit, stored for ``ratebeam events discrepancies``.
"""
