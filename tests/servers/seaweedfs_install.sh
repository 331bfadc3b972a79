#!/usr/bin/env bash
# Builds SeaweedFS (Apache-2.0) from the Go module proxy: its S3 gateway is the object store the
# s3:// storage tests run against (tests/servers/seaweedfs.py).  MinIO cannot be used (AGPL).
# `go install pkg@version` refuses a module whose go.mod has replace directives, so the module is
# downloaded into the module cache and built there as the main module.  ~4 min the first time;
# cached under ${RATEBEAM_RC:-.rc}/seaweedfs.  Idempotent: nothing is built when the binary is there.
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/servers/rc.sh

VERSION=v0.0.0-20261109003541-7506e5f91cd6
BIN="$RC/seaweedfs"
if [ ! -x "$BIN/weed" ]; then
  if command -v go >/dev/null 2>&1; then
    echo "building SeaweedFS $VERSION (the S3 server of the object-store tests) into $BIN" >&2
    mkdir -p "$BIN"
    dir=$(go mod download -json "github.com/seaweedfs/seaweedfs@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    (cd "$dir" && GOFLAGS=-buildvcs=false go build -o "$BIN/weed.tmp" ./weed)
    mv "$BIN/weed.tmp" "$BIN/weed"
  else
    echo "no Go toolchain: the s3:// storage tests against SeaweedFS will be skipped" >&2
  fi
fi
