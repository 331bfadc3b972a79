#!/usr/bin/env bash
# Builds kustomize from the Go module proxy into ${RATEBEAM_RC:-.rc}/kustomize/ (about a minute the
# first time), for tests/test_deploy_manifests.py, which renders deploy/kubernetes with it.
# Idempotent: nothing is built when the binary is there.
set -euo pipefail
cd "$(dirname "$0")/../.."

RC="${RATEBEAM_RC:-$PWD/.rc}"
VERSION=v5.5.0
BIN="$RC/kustomize/$VERSION"
if [ -x "$BIN/kustomize" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "no Go toolchain: the Kubernetes manifest tests will be skipped" >&2
  exit 0
fi
echo "building kustomize $VERSION into $BIN" >&2
mkdir -p "$BIN"
GOBIN="$BIN" GOFLAGS=-buildvcs=false go install "sigs.k8s.io/kustomize/kustomize/v5@$VERSION"
