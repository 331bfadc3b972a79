#!/usr/bin/env bash
# Builds VictoriaLogs v1.52.1 (Apache-2.0) from the Go module proxy for the Loki storage tests
# (tests/servers/victorialogs.py).  A real Loki cannot be installed here (AGPL); VictoriaLogs serves
# Loki's push API (/insert/loki/api/v1/push, JSON and snappy-protobuf), so ratebeam's Loki writer is
# tested against a real receiver.  Cached under ${RATEBEAM_RC:-.rc}/victorialogs (or
# $HOME/.cache/ratebeam/victorialogs when RATEBEAM_RC is unset and the repo is read-only).
# Idempotent: nothing is built when the binary is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/servers/rc.sh

BIN="$RC/victorialogs"
if [ ! -x "$BIN/victoria-logs" ]; then
  if command -v go >/dev/null 2>&1; then
    echo "building victoria-logs v1.52.1 (Loki push API stand-in) into $BIN" >&2
    mkdir -p "$BIN"
    GOBIN="$BIN" GOFLAGS=-buildvcs=false \
      go install github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@v1.52.1
  else
    echo "no Go toolchain: the Loki push tests against VictoriaLogs will be skipped" >&2
  fi
fi
