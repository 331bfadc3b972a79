#!/usr/bin/env bash
# Install requirements-postgres.txt into ${RATEBEAM_RC:-.rc}/cloudkitty-pg-overlay (pip --target), a
# directory put first on PYTHONPATH when CloudKitty's own dbsync builds a PostgreSQL database.  The
# venv itself keeps its pins (the differential test's reference).  Idempotent, like setup_venv.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
rc="${RATEBEAM_RC:-.rc}"
case "$rc" in /*) ;; *) rc="$repo/$rc" ;; esac
overlay="$rc/cloudkitty-pg-overlay"
req="$here/requirements-postgres.txt"
stamp="$overlay/.ratebeam-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "cloudkitty postgres overlay ready: $overlay"
    exit 0
fi
rm -rf "$overlay"
"$rc/cloudkitty-venv/bin/python" -m pip install --quiet --no-deps --target "$overlay" -r "$req"
echo "$want" > "$stamp"
echo "cloudkitty postgres overlay ready: $overlay"
