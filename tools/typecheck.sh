#!/usr/bin/env bash
# Type-check transforms/ and connectors/ with mypy (`make lint` runs this after ruff).
#
# Why a shadow tree: pyproject maps ratebeam.transforms -> transforms/ (and so on), and the editable
# install resolves that mapping through an import hook mypy cannot see.  Symlinks under
# .typecheck/ratebeam/ (in this working tree, so two checkouts never share one) rebuild the
# installed package layout, so mypy resolves `ratebeam.transforms...` and `ratebeam.connectors...`
# imports to the working tree's files.
# Settings live in [tool.mypy] of pyproject.toml.
#
# Usage: tools/typecheck.sh [MYPY]   (MYPY defaults to .venv/bin/mypy)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mypy="$(realpath "${1:-$root/.venv/bin/mypy}")"
shadow="$root/.typecheck"

rm -rf "$shadow/ratebeam"  # rebuilt every time (the mypy cache next to it is kept)
mkdir -p "$shadow/ratebeam"
ln -s "$root/ratebeam/__init__.py" "$shadow/ratebeam/__init__.py"
ln -s "$root/ratebeam/failpoints.py" "$shadow/ratebeam/failpoints.py"
for pkg in transforms connectors pipelines; do
    ln -s "$root/$pkg" "$shadow/ratebeam/$pkg"
done

cd "$shadow"
exec "$mypy" --config-file "$root/pyproject.toml" --cache-dir "$shadow/.mypy_cache" \
    -p ratebeam.transforms -p ratebeam.connectors
