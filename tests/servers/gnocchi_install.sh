#!/usr/bin/env bash
# Installs Gnocchi 4.7.1 (the OpenStack metric service the Gnocchi fetcher and collector tests talk to,
# tests/servers/gnocchi.py) from PyPI into its own virtual environment ${RATEBEAM_RC:-.rc}/gnocchi-venv,
# with gunicorn to serve its WSGI application (gnocchi-api would need uwsgi, which pip compiles for
# about a minute) and psycopg2-binary for its PostgreSQL indexer (the [postgresql] extra compiles
# psycopg2; the [mysql] extra brings the oslo.db, SQLAlchemy and alembic the indexer needs; the
# [keystone] extra brings keystonemiddleware for the second API process in auth_mode = keystone).
# About 20 s and 220 MB the first time; idempotent: nothing is installed when the venv answers.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/servers/rc.sh

VENV="$RC/gnocchi-venv"
if [ -x "$VENV/bin/gnocchi-upgrade" ] && "$VENV/bin/python" -c 'import gnocchi.rest.wsgi, gunicorn, psycopg2, keystonemiddleware' 2>/dev/null; then
  exit 0
fi
echo "installing Gnocchi 4.7.1 into $VENV" >&2
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check 'gnocchi[mysql,keystone]==4.7.1' psycopg2-binary gunicorn
