#!/usr/bin/env bash
# Installs the OpenStack servers the Keystone fetcher and Aetos collector tests start
# (tests/servers/keystone.py, tests/servers/aetos.py), each in its own virtual environment from PyPI
# so their pins never touch ratebeam's venv:
#   $RC/keystone-venv: Keystone 30.0.0 + gunicorn (../shared/real-servers.md §6; ~35 s, ~205 MB)
#   $RC/keystone-template: a bootstrapped Keystone database with its Fernet and credential keys
#                      (keystone-manage db_sync, fernet_setup, credential_setup, bootstrap: about 35 s
#                      on 2 busy cores), which the fixture copies instead of paying that every session
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
template="$RC/keystone-template"
if [ ! -f "$template/keystone.db" ] || [ "$RC/keystone-venv/bin/python" -nt "$template/keystone.db" ]; then
  echo "bootstrapping $template" >&2
  rm -rf "$template" "$template.new" && mkdir -p "$template.new"
  # The same settings as tests/servers/keystone.py's CONFIG (admin password: its ADMIN_PASSWORD).
  cat > "$template.new/keystone.conf" <<CONF
[DEFAULT]
log_file = $template.new/keystone.log
[database]
connection = sqlite:///$template.new/keystone.db
[fernet_tokens]
key_repository = $template.new/fernet-keys
[fernet_receipts]
key_repository = $template.new/fernet-keys
[credential]
key_repository = $template.new/credential-keys
[identity]
password_hash_rounds = 4
CONF
  manage=("$RC/keystone-venv/bin/keystone-manage" --config-file "$template.new/keystone.conf")
  owner=(--keystone-user "$(id -un)" --keystone-group "$(id -gn)")
  "${manage[@]}" db_sync 2>/dev/null
  "${manage[@]}" fernet_setup "${owner[@]}" 2>/dev/null
  "${manage[@]}" credential_setup "${owner[@]}" 2>/dev/null
  "${manage[@]}" bootstrap --bootstrap-password secret --bootstrap-region-id RegionOne 2>/dev/null
  rm -f "$template.new/keystone.conf" "$template.new/keystone.log"
  mv "$template.new" "$template"
fi
install_venv "$RC/aetos-venv" "aetos, gunicorn" 'aetos==3.0.0' gunicorn
