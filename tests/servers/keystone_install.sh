#!/usr/bin/env bash
# Installs the OpenStack servers the Keystone fetcher and Aetos collector tests start
# (tests/servers/keystone.py, tests/servers/aetos.py), each in its own virtual environment from PyPI
# so their pins never touch ratebeam's venv:
#   $RC/keystone-venv: Keystone 30.0.0 + gunicorn (../shared/real-servers.md §6; ~35 s, ~205 MB)
#   $RC/aetos-venv:    Aetos 3.0.0 (the reverse proxy enforcing Keystone multi-tenancy on Prometheus) + gunicorn
# Idempotent: a venv that already imports its server is left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/servers/rc.sh
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"

install_venv() {  # <venv dir> <module that proves it is complete> <pip requirement>...
  local venv="$1" module="$2"; shift 2
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -W ignore -c "import $module" 2>/dev/null; then
    return 0
  fi
  echo "creating $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "$@"
  "$venv/bin/python" -W ignore -c "import $module"
}

install_venv "$RC/keystone-venv" "keystone.server, gunicorn" 'keystone==30.0.0' gunicorn
install_venv "$RC/aetos-venv" "aetos, gunicorn" 'aetos==3.0.0' gunicorn
