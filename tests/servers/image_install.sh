#!/usr/bin/env bash
# Installs what tests/test_image.py needs to build and run ratebeam's container image on a machine
# without a container registry: Debian's podman, runc (the default crun refuses to start containers
# on these machines; tests/image_support.py writes the containers.conf that selects runc) and
# mmdebstrap (builds the test's base images from Debian's packages).  Idempotent: nothing is
# installed when all three are there.
set -euo pipefail

missing=()
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian's ${missing[*]} (the container image test)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q -o DPkg::Lock::Timeout=600 podman runc mmdebstrap >/dev/null
fi
