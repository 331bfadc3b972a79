#!/usr/bin/env bash
# Builds kustomize from the Go module proxy into ${RATEBEAM_RC:-.rc}/kustomize/<version>/ (about a
# minute the first time), for tests/test_deploy_manifests.py, which renders deploy/kubernetes with it.
# Idempotent: nothing is built when the binary is there; without Go the manifest tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${RATEBEAM_RC:-$PWD/.rc}/kustomize/v5.5.0"
[ -x "$BIN/kustomize" ] && exit 0
command -v go >/dev/null 2>&1 || { echo "no Go toolchain: the Kubernetes manifest tests will be skipped" >&2; exit 0; }
echo "building kustomize into $BIN" >&2
mkdir -p "$BIN" && GOBIN="$BIN" GOFLAGS=-buildvcs=false go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0
