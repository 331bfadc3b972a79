#!/usr/bin/env bash
# Installs the Prometheus server the Prometheus collector/fetcher tests start (tests/servers/prometheus.py):
# Debian's `prometheus` package (2.42: /usr/bin/prometheus and /usr/bin/promtool) when either is missing.
# Idempotent.  The packaged service, if Debian starts one, is never used: the fixture starts a private
# server on a free 127.0.0.1 port over a data directory backfilled with promtool.
set -euo pipefail

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "installing Debian's prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi

# `ratebeam run --pushgateway` is tested against a real Pushgateway (tests/test_run_metrics.py).
if ! command -v prometheus-pushgateway >/dev/null 2>&1; then
  echo "installing Debian's prometheus-pushgateway" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends prometheus-pushgateway >/dev/null
fi
