#!/usr/bin/env bash
# Installs the InfluxDB servers the InfluxDB storage tests start (tests/servers/influxdb.py):
#  * Debian's `influxdb` package (influxd 1.6.7, the v1 InfluxQL API) when no influxd is on PATH;
#  * influxd v1.8.10 built from the Go module proxy (pure Go, Flux 0.65) for the /api/v2 write, Flux
#    query and delete endpoints, cached under ${RATEBEAM_RC:-.rc}/influxdb18 (or
#    $HOME/.cache/ratebeam/influxdb18 when RATEBEAM_RC is unset and the repo is read-only).
# Idempotent: nothing is downloaded or built when the binaries are already there.  The packaged
# service, if Debian starts one, is never used: the fixtures start private servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/servers/rc.sh

if ! command -v influxd >/dev/null 2>&1 && [ ! -x /usr/bin/influxd ]; then
  echo "installing Debian's influxdb (v1 API)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q influxdb >/dev/null
fi

BIN18="$RC/influxdb18"
if [ ! -x "$BIN18/influxd" ]; then
  if command -v go >/dev/null 2>&1; then
    echo "building influxd v1.8.10 (v2 API compatibility layer) into $BIN18" >&2
    mkdir -p "$BIN18"
    GOBIN="$BIN18" GOFLAGS=-buildvcs=false go install github.com/influxdata/influxdb/cmd/influxd@v1.8.10
  else
    echo "no Go toolchain: the InfluxDB v2-API tests will be skipped" >&2
  fi
fi
