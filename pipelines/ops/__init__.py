"""Running ratebeam as a service: health and metrics endpoints, configuration from the environment and files.

* ``health``: ``/healthz/live``, ``/healthz/ready`` and ``/metrics`` of the long-running commands
  (``serve``, ``events serve``, ``rpc``), on one port, for probes and Prometheus.
* ``stream``: the same for ``events serve``, polled by its launcher.
* ``figures``: what those endpoints (and ``run --metrics-file``) report, read from the database
  at scrape time and from the runner's counters.
* ``environment``: every key of ``ratebeam.yaml`` from ``RATEBEAM_*`` variables, every secret from
  a file (``*_file`` keys, ``RATEBEAM_*_FILE``), each value's origin kept for ``config check``.
* ``check``: ``ratebeam config check``.
* ``run_metrics``: ``run --metrics-file`` (node_exporter's textfile collector) and ``--pushgateway``.
"""
