#!/usr/bin/env bash
# Installs what the integration tests need that pip cannot: Debian's PostgreSQL, Prometheus and
# InfluxDB 1.6 servers, influxd 1.8 (the v2 API) built once from the Go module proxy, OpenSearch and
# Elasticsearch test nodes from Maven Central, SeaweedFS (the S3 server) from the Go module proxy, and CloudKitty 25.0.0 in its own virtual environment
# (the differential test), and podman, runc and mmdebstrap for the container image test.  Idempotent: a machine
# handed back with everything in place costs a few seconds.  The servers themselves are started by
# the test fixtures (tests/servers/*.py) on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "installing Debian's postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q postgresql >/dev/null
fi

if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "installing Debian's rabbitmq-server (CloudKitty's RPC tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q rabbitmq-server >/dev/null
fi

bash tests/servers/prometheus_install.sh
bash tests/servers/influxdb_install.sh
bash tests/servers/search_install.sh
bash tests/servers/victorialogs_install.sh
bash tests/servers/seaweedfs_install.sh
bash tests/servers/prism_install.sh
bash tests/servers/kustomize_install.sh
bash tests/servers/image_install.sh
bash tests/servers/gnocchi_install.sh
bash tests/servers/keystone_install.sh

if [ -f tests/cloudkitty/setup_venv.sh ]; then
  bash tests/cloudkitty/setup_venv.sh
  bash tests/cloudkitty/setup_postgres_overlay.sh
  bash tests/cloudkitty/setup_client_venv.sh
fi
