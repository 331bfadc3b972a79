#!/usr/bin/env bash
# Create python-cloudkittyclient 6.2.0's own virtual environment, ${RATEBEAM_RC:-.rc}/cloudkittyclient-venv
# (its `cloudkitty` command is what tests/test_cloudkitty_client.py drives, as a user would).
# Idempotent: does nothing when the venv exists and was built from the current
# client-requirements.txt; rebuilds it otherwise.  PyPI only; pip's cache is used.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
rc="${RATEBEAM_RC:-.rc}"
case "$rc" in /*) ;; *) rc="$repo/$rc" ;; esac
venv="$rc/cloudkittyclient-venv"
req="$here/client-requirements.txt"
stamp="$venv/.ratebeam-requirements.sha256"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/cloudkitty" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "cloudkittyclient venv ready: $venv"
    exit 0
fi

echo "creating cloudkittyclient venv: $venv"
rm -rf "$venv"
mkdir -p "$rc"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet -r "$req"
"$venv/bin/cloudkitty" --version >/dev/null
echo "$want" > "$stamp"
echo "cloudkittyclient venv ready: $venv"
