#!/usr/bin/env bash
# Builds Prism, Beam's portable reference runner (the Job API and Fn API that Flink's job server
# speaks), from the Go module proxy at ratebeam's PRISM_VERSION (pipelines/runners/launch.py), into
# ${RATEBEAM_RC:-.rc}/prism/v<version>/prism (about 90 s the first time; the Go module cache keeps the
# sources).  Idempotent: nothing is built when the binary is there.  tests/servers/prism.py starts it.
set -euo pipefail
cd "$(dirname "$0")/../.."

RC="${RATEBEAM_RC:-$PWD/.rc}"
VERSION="$(sed -n 's/^PRISM_VERSION = "\([0-9.]*\)".*/\1/p' pipelines/runners/launch.py)"
if [ -z "$VERSION" ]; then
  echo "cannot read PRISM_VERSION from pipelines/runners/launch.py" >&2
  exit 1
fi
BIN="$RC/prism/v$VERSION"
if [ -x "$BIN/prism" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "no Go toolchain: the Prism (portable runner) tests will be skipped" >&2
  exit 0
fi
echo "building prism v$VERSION (Beam's portable runner) into $BIN" >&2
mkdir -p "$BIN"
GOBIN="$BIN" GOFLAGS=-buildvcs=false go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v$VERSION"
