#!/usr/bin/env bash
# Installs the OpenSearch and Elasticsearch servers the search storage tests start
# (tests/servers/search.py): the integ-test-zip distributions from Maven Central (no plugins, no JDK;
# they run on the machine's Java 17), fetched with Maven into $HOME/.cache/ratebeam (kept between
# runs), unpacked under ${RATEBEAM_RC:-.rc}/search, owned by the unprivileged user `ratebeam-search`
# (both servers refuse to run as root).  Idempotent: nothing is downloaded or unpacked twice.
# Versions: RATEBEAM_OPENSEARCH_VERSION (2.19.1), RATEBEAM_ELASTICSEARCH_VERSION (8.17.4).
# A download that fails is reported and skipped: the fixtures then skip (or fail under CI=true) with
# the reason.
set -euo pipefail
cd "$(dirname "$0")/../.."

OS_VERSION="${RATEBEAM_OPENSEARCH_VERSION:-2.19.1}"
ES_VERSION="${RATEBEAM_ELASTICSEARCH_VERSION:-8.17.4}"
USER_NAME=ratebeam-search
CACHE="$HOME/.cache/ratebeam"
RC="${RATEBEAM_RC:-$PWD/.rc}"
DEST="$RC/search"
mkdir -p "$CACHE" "$DEST"

if ! command -v java >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "installing Java 17, Maven and unzip (search servers)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q openjdk-17-jre-headless maven unzip >/dev/null
fi

if [ "$(id -u)" = 0 ] && ! id "$USER_NAME" >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
fi

# fetch GROUP ARTIFACT VERSION NAME: the zip into the cache, unpacked as $DEST/NAME-VERSION.
fetch() {
  local group=$1 artifact=$2 version=$3 name=$4
  local zip="$CACHE/$artifact-$version.zip" home="$DEST/$name-$version"
  if [ -x "$home/bin/$name" ]; then
    return 0
  fi
  if [ ! -s "$zip" ]; then
    echo "downloading $group:$artifact:$version:zip" >&2
    if ! mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.11.0:copy \
        "-Dartifact=$group:$artifact:$version:zip" "-DoutputDirectory=$CACHE" >&2; then
      echo "could not download $group:$artifact:$version:zip: its tests will be skipped" >&2
      return 0
    fi
  fi
  echo "unpacking $zip into $DEST" >&2
  rm -rf "$home.tmp" && mkdir -p "$home.tmp"
  unzip -q "$zip" -d "$home.tmp"
  mv "$home.tmp/$name-$version" "$home" && rm -rf "$home.tmp"
}

fetch org.opensearch.distribution.integ-test-zip opensearch "$OS_VERSION" opensearch
fetch org.elasticsearch.distribution.integ-test-zip elasticsearch "$ES_VERSION" elasticsearch

if [ "$(id -u)" = 0 ]; then
  chown -R "$USER_NAME" "$DEST"
fi
