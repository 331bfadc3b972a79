#!/usr/bin/env bash
# Create CloudKitty 25.0.0's own virtual environment, ${RATEBEAM_RC:-.rc}/cloudkitty-venv, so that
# CloudKitty's dependency pins never touch ratebeam's venv.  Idempotent: does nothing when the venv
# exists, imports CloudKitty's hashmap module and was built from the current requirements.txt;
# rebuilds it when missing or incomplete.  pip's cache is used (no --no-cache-dir).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
rc="${RATEBEAM_RC:-.rc}"
case "$rc" in /*) ;; *) rc="$repo/$rc" ;; esac
venv="$rc/cloudkitty-venv"
req="$here/requirements.txt"
stamp="$venv/.ratebeam-requirements.sha256"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"  # CloudKitty 25 needs Python >= 3.11

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$venv/bin/python" -c 'import cloudkitty.rating.hash, cloudkitty.rating.hash.db.api' 2>/dev/null; then
    echo "cloudkitty venv ready: $venv"
    exit 0
fi

echo "creating cloudkitty venv: $venv"
rm -rf "$venv"
mkdir -p "$rc"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$req"
"$venv/bin/python" -W ignore -c 'import cloudkitty.rating.hash, cloudkitty.rating.hash.db.api'
echo "$want" > "$stamp"
echo "cloudkitty venv ready: $venv ($("$venv/bin/python" -m pip show cloudkitty | grep ^Version))"
